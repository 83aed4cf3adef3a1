"""Running the configurations: peaks, interleaved rounds against eager, numbers against eager."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.measured.configs import Built
from bench.peers.measure import caller_held_bytes
from peakcut.optimizer.verify import noise_band
from peakcut.runtime import profiler_peak
from peakcut.runtime.equivalence import rounding_tolerance


@dataclass
class Cell:
    """What one configuration measured on one workload (times in seconds, bytes)."""

    workload: str
    name: str
    peak_bytes: int = 0
    host_bytes: int = 0                     # peakcut swaps: host copies (the same RAM on a CPU)
    held_bytes: int = 0                     # held between steps: parameters, buffers, optimizer state, batch
    times: list[float] = field(default_factory=list)
    eager_times: list[float] = field(default_factory=list)    # eager's runs in the same rounds
    setup_seconds: float = 0.0
    budget_seconds: float = 0.0             # peakcut: the time_budget its optimize call was given
    note: str = ""
    error: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)     # peakcut: the check against eager
    predicted: dict[str, Any] = field(default_factory=dict)   # peakcut: the plan's report figures

    @property
    def ratio(self) -> float:
        """Median over the rounds of this configuration's time / eager's in the same round."""
        return statistics.median(t / e for t, e in zip(self.times, self.eager_times, strict=True))

    @property
    def noise(self) -> float:
        return noise_band(self.eager_times)


def peak_of(built: Built, batch: Sequence[torch.Tensor]) -> tuple[int, int, int]:
    """(caller-held bytes + the allocator's peak over one step, host bytes of a plan's
    swaps, the caller-held bytes alone)."""
    delta, _ = profiler_peak(built.step)
    held = caller_held_bytes(built.model, built.optimizer, batch)
    host = built.plan.program.host_peak_bytes if built.plan is not None else 0
    return held + delta, host, held


def interleaved(eager: Callable[[], Any], steps: Sequence[Callable[[], Any]], rounds: int
                ) -> tuple[list[float], list[list[float]]]:
    """`rounds` rounds of eager then every step, each timed on its own."""
    eager_times: list[float] = []
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for run, into in ((eager, eager_times), *zip(steps, times, strict=True)):
            t0 = time.perf_counter()
            run()
            into.append(time.perf_counter() - t0)
    return eager_times, times


def number_tolerance(steps: int, reduction: int = 1 << 16) -> float:
    """Relative (norm-wise) tolerance of float32 results that differ only in rounding, for
    reductions of length up to `reduction` (peakcut.runtime.equivalence.rounding_tolerance)."""
    return rounding_tolerance(torch.float32, reduction, steps)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    scale = b.norm().item()
    return (a - b).norm().item() / scale if scale > 0 else (a - b).norm().item()


def compare_steps(initial: torch.nn.Module, ref: Built, plan: Built, steps: int = 2) -> dict[str, Any]:
    """Run `steps` steps of eager (`ref`) and the plan from the same weights and compare, norm-wise
    relative: the losses, each parameter's update (new - initial) and the AdamW moments."""
    worst: dict[str, tuple[float, str]] = {"loss": (0.0, ""), "update": (0.0, ""), "moments": (0.0, "")}
    for _ in range(steps):
        torch.manual_seed(0)
        la = ref.step()
        torch.manual_seed(0)
        lb = plan.step()
        r = _rel(torch.as_tensor(lb), torch.as_tensor(la))
        worst["loss"] = max(worst["loss"], (r, "loss"))
    names = dict(initial.named_parameters())
    pa, pb = dict(ref.model.named_parameters()), dict(plan.model.named_parameters())
    tol = number_tolerance(steps)
    left_out = 0
    for n, p0 in names.items():
        sa, sb = ref.optimizer.state.get(pa[n], {}), plan.optimizer.state.get(pb[n], {})
        keep = moments_agree(sa, sb, tol)
        left_out += 0 if keep is None else int((~keep).sum())
        a, b = pa[n] - p0, pb[n] - p0
        if keep is not None:
            a, b = a[keep], b[keep]
        worst["update"] = max(worst["update"], (_rel(b, a), n))
        for k in ("exp_avg", "exp_avg_sq"):
            if k in sa and k in sb:
                worst["moments"] = max(worst["moments"], (_rel(sb[k], sa[k]), f"{n} {k}"))
            elif (k in sa) != (k in sb):
                worst["moments"] = (math.inf, f"{n} {k} missing")
    return {"steps": steps, "tolerance": tol, "ok": all(v <= tol for v, _ in worst.values()),
            "adam_rounding_elements": left_out,
            **{k: {"max_rel": v, "where": w} for k, (v, w) in worst.items()}}


def moments_agree(ref: dict[str, Any], plan: dict[str, Any], tol: float) -> torch.Tensor | None:
    """Elements whose AdamW moments agree within `tol` element-wise (relative): where the
    update is compared. Where a gradient is small against the terms it sums (cancellation),
    rounding is a large part of it, and Adam's m / sqrt(v) turns that into an update
    difference of order lr (of either sign where the gradient is rounding-zero): eager and a
    plan that sums in another order (a fission's parts, another kernel) both make a correct
    update there. The moments themselves are compared whole, norm-wise (they carry the
    gradients); the updates where the moments agree check the update's arithmetic. None: no
    moments (not AdamW). On the medium U-Net's plan of 2026-11-27 (batch fission of single
    ops), 81 of downs.1.4.weight's 256 moments differed by more than the tolerance (first
    moments near 1.7e-8, against 1.4e-5 at most) and the kept updates agreed within 1.4e-4."""
    masks = []
    for k in ("exp_avg", "exp_avg_sq"):
        a, b = ref.get(k), plan.get(k)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() and a.shape == b.shape:
            a, b = a.detach().double(), b.detach().double()
            masks.append((a - b).abs() <= tol * a.abs())
    if not masks:
        return None
    return masks[0] if len(masks) == 1 else masks[0] & masks[1]
