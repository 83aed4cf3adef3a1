"""The update as torch.optim's foreach and fused implementations run it, traced per tensor.

torch.optim's foreach code (`_multi_tensor_sgd`, `_multi_tensor_adam`) splits a param group's
tensors by device and dtype and runs each op over a whole list before the next op; its fused
code (`_fused_adam`) advances the step tensors and calls one kernel over the lists. Every one
of those list ops is element-wise per tensor (tensor i's result reads tensor i of each list
only), so it is traced here as one call per tensor of the per-tensor kernel the list op runs
on each tensor (`lerp_`, `addcdiv_`, ... ; the fused kernel itself on one-tensor lists), in
the list op's order: all tensors of one op, then the next op. Liveness then counts the
temporaries a list op holds at once (the square roots of every exp_avg_sq) as the real code
holds them. Each per-tensor call carries an ir.foreach.ForeachTag naming its list op, and
code generation writes consecutive calls of one list op back as that one call
(codegen.foreach_code).

The per-tensor arithmetic is the list op's: same kernel, same scalar arguments, same order of
operations (checked against torch/optim/adam.py and sgd.py), so the numbers are eager's. Two
scalars are per group where torch.optim's list op takes one value: SGD's gradient factor
(`1 - dampening`; 1 on a first step, where torch.optim copies the gradient instead:
spec.scalars refuses a group with some parameters on their first step and dampening set)
and Adam's hyper-parameters of the fused kernel (lr, betas, weight decay, eps).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch
from torch.optim.optimizer import Optimizer

from peakcut.ir.foreach import ForeachTag
from peakcut.spec.optimizers import GroupSpec

if TYPE_CHECKING:
    from peakcut.capture.trace import TraceLog

Hp = Callable[[str, float], float]
"""The trace's run-time scalar of a name (capture.update.HyperTable)."""


class Runs:
    """Records which FX nodes each traced list op made (TraceLog.runs), one run per list call."""

    def __init__(self, log: TraceLog | None) -> None:
        self.log = log

    def each(self, op: str, lists: Sequence[Sequence[object]], fn: Callable[..., torch.Tensor | None],
             ) -> list[torch.Tensor | None]:
        """fn(*(l[i] for l in lists)) for every i, in order, tagged as tensor i of one call of `op`."""
        size = len(lists[0])
        log = self.log
        run = log.new_run() if log is not None else 0
        out = []
        for i in range(size):
            start = log.count() if log is not None else 0
            out.append(fn(*(lst[i] for lst in lists)))
            if log is not None:
                log.runs.append((start, log.count(), ForeachTag(run, op, size, i)))
        return out


def buckets(names: Sequence[str], params: Mapping[str, torch.Tensor]) -> list[list[str]]:
    """The parameter names split by device and dtype, in the order torch.optim groups them
    (Optimizer._group_tensors_by_device_and_dtype)."""
    tensors: list[torch.Tensor | None] = [params[n] for n in names]
    grouped = Optimizer._group_tensors_by_device_and_dtype([tensors], with_indices=True)
    return [[names[i] for i in indices] for _, indices in grouped.values()]


def foreach_sgd(gi: int, group: GroupSpec, names: Sequence[str], params: Mapping[str, torch.Tensor],
                grads: Mapping[str, torch.Tensor], state: Mapping[str, Mapping[str, torch.Tensor]],
                hp: Hp, runs: Runs) -> None:
    """torch.optim's _multi_tensor_sgd on these parameters, per device/dtype bucket."""
    for bucket in buckets(names, params):
        _sgd_bucket(gi, group, bucket, params, grads, state, hp, runs)


def _sgd_bucket(gi: int, group: GroupSpec, bucket: Sequence[str], params: Mapping[str, torch.Tensor],
                grads: Mapping[str, torch.Tensor], state: Mapping[str, Mapping[str, torch.Tensor]], hp: Hp,
                runs: Runs) -> None:
    h = group.hyper
    ps = [params[n] for n in bucket]
    gs: list = [grads[n] for n in bucket]
    maximize = group.flag("maximize")
    if maximize:
        gs = runs.each("_foreach_neg", [gs], torch.neg)
    if h["weight_decay"] != 0:
        wd = hp(f"g{gi}:weight_decay", h["weight_decay"])
        if maximize:     # torch.optim reuses the negated gradients
            runs.each("_foreach_add_", [gs, ps], lambda g, p: g.add_(p, alpha=wd))
        else:
            gs = runs.each("_foreach_add", [gs, ps], lambda g, p: g.add(p, alpha=wd))
    if h["momentum"] != 0:
        bufs = [state[n]["momentum_buffer"] for n in bucket]
        factors = [hp(f"{n}:momentum_factor", h["momentum"]) for n in bucket]
        runs.each("_foreach_mul_", [bufs, factors], lambda b, f: b.mul_(f))
        gf = hp(f"g{gi}:grad_factor", 1 - h["dampening"])
        runs.each("_foreach_add_", [bufs, gs], lambda b, g: b.add_(g, alpha=gf))
        if group.flag("nesterov"):      # in place on the gradients, as torch.optim does
            m = hp(f"g{gi}:momentum", h["momentum"])
            runs.each("_foreach_add_", [gs, bufs], lambda g, b: g.add_(b, alpha=m))
        else:
            gs = bufs
    neg_lr = hp(f"g{gi}:neg_lr", -h["lr"])
    runs.each("_foreach_add_", [ps, gs], lambda p, g: p.add_(g, alpha=neg_lr))


def foreach_adam(decoupled: bool, gi: int, group: GroupSpec, names: Sequence[str],
                 params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
                 state: Mapping[str, Mapping[str, torch.Tensor]], hp: Hp, runs: Runs) -> None:
    """torch.optim's _multi_tensor_adam (capturable=False) on these parameters, per bucket."""
    for bucket in buckets(names, params):
        _adam_bucket(decoupled, gi, group, bucket, params, grads, state, hp, runs)


def _adam_bucket(decoupled: bool, gi: int, group: GroupSpec, bucket: Sequence[str],
                 params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
                 state: Mapping[str, Mapping[str, torch.Tensor]], hp: Hp, runs: Runs) -> None:
    h = group.hyper
    ps = [params[n] for n in bucket]
    gs: list = [grads[n] for n in bucket]
    ms = [state[n]["exp_avg"] for n in bucket]
    vs = [state[n]["exp_avg_sq"] for n in bucket]
    maximize = group.flag("maximize")
    if maximize:
        gs = runs.each("_foreach_neg", [gs], torch.neg)
    if h["weight_decay"] != 0:
        if decoupled:
            decay = hp(f"g{gi}:decay", 1 - h["lr"] * h["weight_decay"])
            runs.each("_foreach_mul_", [ps], lambda p: p.mul_(decay))
        else:
            wd = hp(f"g{gi}:weight_decay", h["weight_decay"])
            if maximize:
                runs.each("_foreach_add_", [gs, ps], lambda g, p: g.add_(p, alpha=wd))
            else:
                gs = runs.each("_foreach_add", [gs, ps], lambda g, p: g.add(p, alpha=wd))
    w = hp(f"g{gi}:one_minus_beta1", 1 - h["beta1"])
    runs.each("_foreach_lerp_", [ms, gs], lambda m, g: m.lerp_(g, w))
    beta2 = hp(f"g{gi}:beta2", h["beta2"])
    runs.each("_foreach_mul_", [vs], lambda v: v.mul_(beta2))
    c = hp(f"g{gi}:one_minus_beta2", 1 - h["beta2"])
    runs.each("_foreach_addcmul_", [vs, gs, gs], lambda v, g1, g2: v.addcmul_(g1, g2, value=c))
    del gs
    if group.flag("amsgrad"):
        maxes = [state[n]["max_exp_avg_sq"] for n in bucket]
        for mx, v in zip(maxes, vs, strict=True):     # _foreach_maximum_: same values, one temporary
            mx.copy_(torch.maximum(mx, v))
        denoms = runs.each("_foreach_sqrt", [maxes], torch.sqrt)
    else:
        denoms = runs.each("_foreach_sqrt", [vs], torch.sqrt)
    bc2 = [hp(f"{n}:bias_correction2_sqrt", (1 - h["beta2"]) ** 0.5) for n in bucket]
    runs.each("_foreach_div_", [denoms, bc2], lambda d, b: d.div_(b))
    eps = hp(f"g{gi}:eps", h["eps"])
    runs.each("_foreach_add_", [denoms], lambda d: d.add_(eps))
    steps = [hp(f"{n}:neg_step_size", -h["lr"] / (1 - h["beta1"])) for n in bucket]
    runs.each("_foreach_addcdiv_", [ps, ms, denoms, steps], lambda p, m, d, s: p.addcdiv_(m, d, value=s))


def fused_adam(decoupled: bool, gi: int, group: GroupSpec, names: Sequence[str],
               params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
               state: Mapping[str, Mapping[str, torch.Tensor]], hp: Hp, runs: Runs) -> None:
    """torch.optim's _fused_adam (no GradScaler) on these parameters, per bucket: the step
    tensors advanced, then the fused kernel, both per tensor."""
    h = group.hyper
    kernel = torch._fused_adamw_ if decoupled else torch._fused_adam_
    name = "_fused_adamw_" if decoupled else "_fused_adam_"
    amsgrad = group.flag("amsgrad")
    lr, beta1, beta2 = hp(f"g{gi}:lr", h["lr"]), hp(f"g{gi}:beta1", h["beta1"]), hp(f"g{gi}:beta2", h["beta2"])
    wd, eps, maximize = hp(f"g{gi}:weight_decay", h["weight_decay"]), hp(f"g{gi}:eps", h["eps"]), group.flag("maximize")
    for bucket in buckets(names, params):
        steps = [state[n]["step"] for n in bucket]
        runs.each("_foreach_add_", [steps], lambda s: s.add_(1))

        def one(n: str) -> None:
            s = state[n]
            kernel([params[n]], [grads[n]], [s["exp_avg"]], [s["exp_avg_sq"]],
                   [s["max_exp_avg_sq"]] if amsgrad else [], [s["step"]], lr=lr, beta1=beta1, beta2=beta2,
                   weight_decay=wd, eps=eps, amsgrad=amsgrad, maximize=maximize)

        runs.each(name, [bucket], one)
