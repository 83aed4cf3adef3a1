"""Numeric equivalence of a built step against eager PyTorch over several steps.

Eager reference: loss_fn(model, batch).backward() and the recipe's torch.optim
optimizer (peakcut.SGD / Adam / AdamW, torch.optim's default implementation) on a deep
copy of the model. Compared after every step: loss,
gradients, parameters, buffers (e.g. BatchNorm running statistics) and
optimizer state.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from peakcut.codegen.program import Step
from peakcut.spec.optimizers import Recipe


@dataclass(frozen=True)
class Difference:
    step: int
    kind: str        # loss | grad | param | buffer | state | output
    name: str
    max_abs: float
    ok: bool


@dataclass
class EquivalenceReport:
    rtol: float
    atol: float
    differences: list[Difference] = field(default_factory=list)
    loss_tolerance: tuple[float, float] | None = None
    """(rtol, atol) of the loss when it differs from rtol/atol (a loss computed in a
    narrower dtype than the parameters)."""

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.differences)

    def failures(self) -> list[Difference]:
        return [d for d in self.differences if not d.ok]

    def kinds(self) -> set[str]:
        return {d.kind for d in self.differences}

    def __str__(self) -> str:
        bad = self.failures()
        if not bad:
            return f"equivalent ({len(self.differences)} comparisons, rtol={self.rtol}, atol={self.atol})"
        lines = [f"{len(bad)} of {len(self.differences)} comparisons differ (rtol={self.rtol}, atol={self.atol}):"]
        lines += [f"  step {d.step} {d.kind} {d.name}: max |diff| {d.max_abs:.3g}" for d in bad[:20]]
        return "\n".join(lines)


ROUNDING_SAFETY = 16.0


def rounding_tolerance(dtype: torch.dtype, reduction: int, steps: int = 1) -> float:
    """Relative tolerance of `dtype` results that differ only in rounding: two computations of
    a reduction of length K (another summation order, kernel or split) differ by about
    u * sqrt(K) (u: unit roundoff, eps / 2); ROUNDING_SAFETY covers the constant in front,
    and errors carried through `steps` optimizer steps add up at most linearly."""
    u = torch.finfo(dtype).eps / 2
    return ROUNDING_SAFETY * u * math.sqrt(max(1, reduction)) * max(1, steps)


def default_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) per dtype: fp32/fp64 tight; half types loose."""
    if dtype in (torch.float16, torch.bfloat16):
        return 1e-2, 1e-2
    return 1e-5, 1e-6


def torch_optimizer(recipe: Recipe, params: Any) -> torch.optim.Optimizer:
    """The recipe's torch.optim optimizer over the trainable ones of `params`."""
    return recipe.build([p for p in params if p.requires_grad])


class _Comparer:
    def __init__(self, report: EquivalenceReport) -> None:
        self.report = report

    def __call__(self, step: int, kind: str, name: str, ours: Any, ref: Any) -> None:
        if ours is None or ref is None:
            self.report.differences.append(Difference(step, kind, name, float("inf"), ours is None and ref is None))
            return
        ours = torch.as_tensor(ours).detach().double().cpu()
        ref = torch.as_tensor(ref).detach().double().cpu()
        if ours.shape != ref.shape:
            self.report.differences.append(Difference(step, kind, name, float("inf"), False))
            return
        diff = float((ours - ref).abs().max()) if ours.numel() else 0.0
        rtol, atol = self.report.rtol, self.report.atol
        if kind == "loss" and self.report.loss_tolerance is not None:
            rtol, atol = self.report.loss_tolerance
        ok = bool(torch.allclose(ours, ref, rtol=rtol, atol=atol))
        self.report.differences.append(Difference(step, kind, name, diff, ok))


def check_equivalence(
    model: torch.nn.Module,
    batch: Any,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None,
    optimizer: Recipe | None,
    build: Callable[[torch.nn.Module], Step],
    steps: int = 3,
    rtol: float | None = None,
    atol: float | None = None,
    loss_tolerance: tuple[float, float] | None = None,
    seed: int | None = None,
) -> EquivalenceReport:
    """Run `steps` steps eagerly and with build(model) on copies of `model`; compare everything.

    build(model) must return a Step whose outputs include the gradients
    (capture with keep_grads=True, or optimizer None). loss_tolerance: (rtol, atol) of the
    loss alone, for a loss computed in a narrower dtype than the parameters. seed: seed the
    default generator with seed + k before both runs of step k, so that random ops
    (dropout) draw the same numbers in both (None: leave the generator alone).
    """
    dtype = next(model.parameters()).dtype
    d_rtol, d_atol = default_tolerance(dtype)
    report = EquivalenceReport(rtol if rtol is not None else d_rtol, atol if atol is not None else d_atol,
                               loss_tolerance=loss_tolerance)
    compare = _Comparer(report)
    ref_model = copy.deepcopy(model)
    our_model = copy.deepcopy(model)
    step_fn = build(our_model)
    opt = torch_optimizer(optimizer, ref_model.parameters()) if optimizer is not None else None

    if loss_fn is None:
        with torch.no_grad():
            ref_out = ref_model(*batch) if isinstance(batch, (tuple, list)) else ref_model(batch)
        ours = step_fn(our_model, batch)
        for i, (a, b) in enumerate(zip(torch.utils._pytree.tree_leaves(ours),
                                       torch.utils._pytree.tree_leaves(ref_out), strict=True)):
            compare(1, "output", str(i), a, b)
        return report

    for k in range(1, steps + 1):
        for p in ref_model.parameters():
            p.grad = None
        for p in our_model.parameters():
            p.grad = None
        if seed is not None:
            torch.manual_seed(seed + k)
        ref_loss = loss_fn(ref_model, batch)
        ref_loss.backward()
        if opt is not None:
            opt.step()
        if seed is not None:
            torch.manual_seed(seed + k)
        loss = step_fn(our_model, batch)
        compare(k, "loss", "loss", loss, ref_loss)
        ref_params = dict(ref_model.named_parameters())
        for name, p in our_model.named_parameters():
            rp = ref_params[name]
            if rp.grad is not None or p.grad is not None:
                compare(k, "grad", name, p.grad, rp.grad)
            compare(k, "param", name, p, rp)
        ref_buffers = dict(ref_model.named_buffers())
        for name, b in our_model.named_buffers():
            compare(k, "buffer", name, b, ref_buffers[name])
        if opt is not None:
            _compare_state(k, compare, step_fn, opt, ref_params)
    return report


def _compare_state(k: int, compare: _Comparer, step_fn: Step, opt: torch.optim.Optimizer,
                   ref_params: dict[str, torch.nn.Parameter]) -> None:
    for key, value in step_fn.state.items():
        name = key.removeprefix("state:")
        pname, _, slot = name.rpartition(".")
        ref_state = opt.state.get(ref_params[pname], {})
        compare(k, "state", name, value, ref_state.get(slot))
