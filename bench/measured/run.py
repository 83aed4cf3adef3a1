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
    sign_only = 0
    for n, p0 in names.items():
        sa, sb = ref.optimizer.state.get(pa[n], {}), plan.optimizer.state.get(pb[n], {})
        keep = _not_rounding_zero(sa.get("exp_avg"), tol)
        sign_only += 0 if keep is None else int((~keep).sum())
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
            "adam_sign_elements": sign_only,
            **{k: {"max_rel": v, "where": w} for k, (v, w) in worst.items()}}


def _not_rounding_zero(exp_avg: torch.Tensor | None, tol: float) -> torch.Tensor | None:
    """Elements whose AdamW first moment is more than rounding (tol x the tensor's largest):
    where a gradient is zero up to rounding, Adam's m / sqrt(v) is about +-1 on either side
    of zero, so eager and a plan that rounds differently both make a correct update of about
    lr, of either sign. Those elements are left out of the update's comparison (the moments
    themselves are compared whole). None: no moment (not AdamW)."""
    if exp_avg is None or exp_avg.numel() == 0:
        return None
    m = exp_avg.detach().abs()
    return m > tol * m.max()
