"""The user's training loop, next to the plan: a torch.optim optimizer in param groups, an LR
schedule, gradient clipping and bf16 autocast, as the README's loop writes them.

Eager: `loss_fn(model, batch).backward(); clip_grad_norm_; optimizer.step();
optimizer.zero_grad(); scheduler.step()`. Ours: the plan's Step bound to its own copy of
the same optimizer (peakcut.build(..., optimizer=)), then the same scheduler.step(). After
every step: the loss, every parameter, every buffer and the optimizer's state_dict (its
state tensors and each group's hyper-parameters, the scheduled lr included).

Tolerance. Without autocast, each value elementwise within rounding_tolerance(dtype, K,
steps) (bench.fuzz.harness). Under bf16 autocast the matmuls and convolutions round their
outputs to bf16 and a split or rewritten op rounds differently from eager's. How much that
moves a value depends on the case (a gradient that is a small difference of large terms
moves far), so the running machine measures it: a third loop runs the same step without
autocast. Each kind of value, all its tensors together (the loss; every gradient; every
parameter; every buffer; all optimizer state), may differ from eager's by NOISE_FACTOR
times eager's distance from that precise loop, or by autocast_tolerance(steps) (one bf16
rounding, 2^-8, per step) times its size (the loss, gradients, buffers) or, for parameters
and optimizer state, times how far eager training moved them, whichever is larger. Eager's
distance from the precise loop is taken relative to the value's size and as the largest of
the steps so far: it varies by luck from step to step. All
together, not tensor by tensor: a gradient that is zero up to rounding (a bias that a
softmax or a norm ignores) is rounding noise in eager and in any plan, and a batch split
of a bf16 reduction rounds each part (an error of u times the parts, which can cancel),
so such a tensor alone proves nothing, while a wrong term shows in the whole. A 5%
error in the loss is caught (tests/fuzz/test_fuzz_catches.py). Non-finite values must be
the same, in the same places, as eager's; the finite ones are compared.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from peakcut.codegen.program import Step

NOISE_FACTOR = 4.0    # two bf16 computations of one value differ by up to ~2x either's error; 2x margin
NUDGE_FACTOR = 2.0    # a nudged loop moves each value one way; a difference may go either way


@dataclass
class LoopReport:
    """Every difference above the tolerance, as 'step k: what (measured vs allowed)'."""

    tolerance: float
    norm_wise: bool
    failures: list[str] = field(default_factory=list)
    worst: float = 0.0           # largest measured / allowed ratio seen
    # norm-wise: an absolute difference per element allowed whatever the values' size (floor x
    # sqrt(elements)); for values that are rounding noise themselves (a sum that cancels to
    # zero in exact arithmetic), where a bound relative to their size is no bound
    floor: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    def __str__(self) -> str:
        how = "norm-wise" if self.norm_wise else "elementwise"
        head = f"user loop, {how} tolerance {self.tolerance:.2e}, worst {self.worst:.2f} of allowed"
        return head if self.ok else head + ":\n  " + "\n  ".join(self.failures[:12])


@dataclass
class UserLoop:
    """What the user's loop uses besides the model: how to make the optimizer for a model,
    the clipping norm, the LR schedule's lambda (None: no scheduler)."""

    make_optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    max_grad_norm: float | None = None
    lr_lambda: Callable[[int], float] | None = None

    def scheduler(self, opt: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR | None:
        return None if self.lr_lambda is None else torch.optim.lr_scheduler.LambdaLR(opt, self.lr_lambda)


class _EagerLoop:
    """The user's eager loop on its own copy of the model. nudge > 0: every gradient moved by
    up to what the judge allows it to differ (nudge x (1 + |g|), a random sign per element)
    before the update, so that this loop shows how far the allowed gradient differences carry
    the parameters and the optimizer state through the user's optimizer (an Adam update of a
    gradient that is rounding noise, near zero, moves a parameter by about lr x noise / eps)."""

    def __init__(self, model: nn.Module, loss_fn: Callable[[nn.Module, Any], torch.Tensor], loop: UserLoop,
                 nudge: float = 0.0) -> None:
        self.model, self.loss_fn, self.loop = copy.deepcopy(model), loss_fn, loop
        self.opt = loop.make_optimizer(self.model)
        self.sched = loop.scheduler(self.opt)
        self.nudge = nudge

    def step(self, batch: Any, seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One step; the loss and the (clipped) gradients the update used."""
        torch.manual_seed(seed)
        loss = self.loss_fn(self.model, batch)
        loss.backward()
        if self.nudge:
            signs = torch.Generator().manual_seed(seed)
            for p in self.model.parameters():
                if p.grad is not None:
                    sign = torch.randint(0, 2, p.grad.shape, generator=signs).to(p.grad.dtype) * 2 - 1
                    p.grad += self.nudge * (1 + p.grad.abs()) * sign
        if self.loop.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([p for g in self.opt.param_groups for p in g["params"]],
                                           self.loop.max_grad_norm)
        grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.opt.step()
        self.opt.zero_grad()
        if self.sched is not None:
            self.sched.step()
        return loss.detach(), grads


def run_user_loop(model: nn.Module, batch: Any, loss_fn: Callable[[nn.Module, Any], torch.Tensor],
                  loop: UserLoop, build: Callable[[nn.Module, torch.optim.Optimizer], Step], steps: int,
                  tolerance: float, seed: int,
                  precise_loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None) -> LoopReport:
    """Run `steps` steps of the eager loop and of build(model copy, its optimizer), compare.
    precise_loss_fn (for a loss_fn under autocast: the same without it): compare norm-wise,
    and allow NOISE_FACTOR times how far the eager loop is from the precise one."""
    report = LoopReport(tolerance, precise_loss_fn is not None)
    ref = _EagerLoop(model, loss_fn, loop)
    precise = _EagerLoop(model, precise_loss_fn, loop) if precise_loss_fn is not None else None
    ours = copy.deepcopy(model)
    our_opt = loop.make_optimizer(ours)
    our_sched = loop.scheduler(our_opt)
    step = build(ours, our_opt)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    compare = _Compare(report)
    for k in range(1, steps + 1):
        ref_loss, ref_grads = ref.step(batch, seed + k)
        near_loss, near_grads = precise.step(batch, seed + k) if precise is not None else (None, {})
        torch.manual_seed(seed + k)
        loss = step(ours, batch)
        for name, p in ours.named_parameters():     # the step returns the clipped gradients (keep_grads)
            if name in ref_grads or p.grad is not None:
                compare(k, f"gradient {name}", p.grad, ref_grads.get(name), None, near_grads.get(name))
        our_opt.zero_grad()
        if our_sched is not None:
            our_sched.step()
        compare(k, "loss", loss.detach(), ref_loss, None, near_loss)
        ref_params = dict(ref.model.named_parameters())
        near_params = dict(precise.model.named_parameters()) if precise is not None else {}
        for name, p in ours.named_parameters():
            compare(k, f"parameter {name}", p, ref_params[name], start[name], near_params.get(name))
        ref_buffers = dict(ref.model.named_buffers())
        near_buffers = dict(precise.model.named_buffers()) if precise is not None else {}
        for name, b in ours.named_buffers():
            compare(k, f"buffer {name}", b, ref_buffers[name], None, near_buffers.get(name))
        near_state = {w: b for w, _, b in _state_pairs(precise.opt, precise.opt)} if precise is not None else {}
        for what, a, b in _state_pairs(our_opt, ref.opt):
            compare(k, what, a, b, torch.zeros_like(b) if isinstance(b, torch.Tensor) else None, near_state.get(what))
        compare.finish_step(k)
        groups = [_hyper(g) for g in our_opt.param_groups], [_hyper(g) for g in ref.opt.param_groups]
        if groups[0] != groups[1]:
            report.failures.append(f"step {k}: param groups {groups[0]} vs eager {groups[1]}")
    return report


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def _state_pairs(ours: torch.optim.Optimizer, ref: torch.optim.Optimizer) -> Iterator[tuple[str, Any, Any]]:
    a, b = ours.state_dict()["state"], ref.state_dict()["state"]
    if a.keys() != b.keys():
        yield f"optimizer state keys {sorted(a)}", None, sorted(b)
        return
    for i, slots in b.items():
        if a[i].keys() != slots.keys():
            yield f"optimizer state {i} slots {sorted(a[i])}", None, sorted(slots)
            continue
        for slot, value in slots.items():
            yield f"optimizer state {i}.{slot}", a[i][slot], value


class _Compare:
    """ours against ref: elementwise (torch.allclose with rtol = atol = the tolerance), or
    norm-wise, per kind of value (the loss, all gradients together, all parameters, all
    buffers, all optimizer state; finish_step judges them): ||ours - ref|| against the
    larger of the tolerance times ||ref - start|| (start given: how far training moved it)
    or ||ref||, and NOISE_FACTOR times ||ref - precise|| (how far rounding to bf16 took
    eager from the precise loop). Elementwise, a parameter or optimizer state may also be
    given as a nudged eager loop has it (_EagerLoop's nudge): NUDGE_FACTOR times its distance
    from eager is allowed."""

    def __init__(self, report: LoopReport) -> None:
        self.report = report
        # norm-wise: per kind of value, the squared sums of (ours - ref), scale, noise, and the
        # tensor that differs most
        self.sums: dict[str, list[Any]] = {}
        self.relative_noise: dict[str, float] = {}    # per kind: the largest noise / scale of the steps so far

    def finish_step(self, k: int) -> None:
        """Norm-wise: judge each kind of value (all gradients together, all parameters, ...).
        The noise allowed is eager's distance from the precise loop at this step, or the
        largest such distance relative to the value's size at any step before: that distance
        varies by luck from step to step (a step where eager lands near the precise loop says
        nothing of where another bf16 evaluation of it lands)."""
        tol = self.report.tolerance
        for kind, (diff2, scale2, noise2, (_, most), count) in self.sums.items():
            scale, noise = math.sqrt(scale2), math.sqrt(noise2)
            if scale > 0:
                self.relative_noise[kind] = max(self.relative_noise.get(kind, 0.0), noise / scale)
            noise = max(noise, self.relative_noise.get(kind, 0.0) * scale)
            diff = math.sqrt(diff2)
            allowed = max(tol * scale, NOISE_FACTOR * noise, self.report.floor * math.sqrt(count))
            ratio = diff / allowed if allowed > 0 else (0.0 if diff == 0 else float("inf"))
            self.report.worst = max(self.report.worst, ratio)
            if not ratio <= 1.0:
                self.report.failures.append(f"step {k}: every {kind} together: {diff:.3e} vs allowed "
                                            f"{allowed:.3e} (most in {most})")
        self.sums.clear()

    def __call__(self, k: int, what: str, ours: Any, ref: Any, start: torch.Tensor | None,
                 precise: torch.Tensor | None = None, nudged: torch.Tensor | None = None) -> None:
        """Compare one value (class doc). nudged (elementwise; parameters and optimizer state):
        the value in an eager loop whose gradients were moved by one step's tolerance
        (_EagerLoop's nudge); NUDGE_FACTOR times its distance from eager is allowed where that
        is more than the tolerance (where the optimizer amplifies gradient differences)."""
        report = self.report
        if not isinstance(ref, torch.Tensor) or not isinstance(ours, torch.Tensor):
            if ours != ref:
                report.failures.append(f"step {k}: {what}: {ours!r} vs eager {ref!r}")
            return
        if ours.shape != ref.shape or ours.dtype != ref.dtype:
            report.failures.append(f"step {k}: {what}: {ours.dtype}{list(ours.shape)} "
                                   f"vs eager {ref.dtype}{list(ref.shape)}")
            return
        if not ref.is_floating_point():
            if not torch.equal(ours, ref):
                report.failures.append(f"step {k}: {what}: integer values differ")
            return
        a, b = ours.detach().double(), ref.detach().double()
        if not a.numel():
            return
        # non-finite values: the same ones in the same places, then only the finite ones compared
        if not (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.isposinf(), b.isposinf())
                and torch.equal(a.isneginf(), b.isneginf())):
            report.worst = float("inf")
            report.failures.append(f"step {k}: {what}: non-finite values differ from eager's")
            return
        finite = b.isfinite()
        a, b = a[finite], b[finite]
        tol = report.tolerance
        if report.norm_wise:
            scale = float((b - start.double()[finite]).norm()) if start is not None else float(b.norm())
            noise = float((b - precise.detach().double()[finite]).norm()) if precise is not None else 0.0
            if not math.isfinite(noise):       # the precise loop overflowed: no noise to allow
                noise = 0.0
            diff = float((a - b).norm())
            kind = "optimizer state" if what.startswith("optimizer state") else what.split(" ")[0]
            sums = self.sums.setdefault(kind, [0.0, 0.0, 0.0, (-1.0, ""), 0])
            sums[0] += diff ** 2
            sums[1] += scale ** 2
            sums[2] += noise ** 2
            sums[3] = max(sums[3], (diff, what))
            sums[4] += b.numel()
            return
        if not b.numel():                      # all non-finite, and the same as eager's
            return
        bound = tol * (1 + b.abs())
        if nudged is not None:           # where the nudged loop diverged it shows nothing: no allowance
            moved = (b - nudged.detach().double()[finite]).abs()
            bound = torch.maximum(bound, NUDGE_FACTOR * torch.where(moved.isfinite(), moved, 0.0))
        ratio = float(((a - b).abs() / bound).max())
        diff, allowed = float((a - b).abs().max()), float(bound.max())
        report.worst = max(report.worst, ratio)
        if not ratio <= 1.0:
            report.failures.append(f"step {k}: {what}: {diff:.3e} vs allowed {allowed:.3e}")


def autocast_tolerance(steps: int) -> float:
    """The floor of the norm-wise tolerance under bf16 autocast: one bf16 rounding (u = 2^-8)
    per step, carried linearly (module doc; NOISE_FACTOR times eager's distance from the
    precise loop allows more where the case needs it)."""
    return torch.finfo(torch.bfloat16).eps / 2 * steps
