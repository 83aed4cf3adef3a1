"""The optimizer update as traced into the step.

The traced update repeats, per param group, the code torch.optim runs for that group on the
parameters' device (spec.optimizers.resolve_impl): the single-tensor code (`_single_tensor_sgd`,
`_single_tensor_adam`, here) or the foreach and fused code (`_multi_tensor_sgd`,
`_multi_tensor_adam`, `_fused_adam`: capture.list_update) op for op, with every
hyper-parameter a run-time scalar:
during tracing each one is a unique sentinel float (HyperTable), which capture then
replaces in the graph by an `ir.node.Hyper` carrying its name. At every call the
step computes those scalars from the user's optimizer (`param_groups`, per-parameter
`state['step']` and momentum buffers) with the same Python float arithmetic as
torch.optim (peakcut.spec.scalars), so the program calls the same kernels with the same
arguments as the eager loop, and an LR scheduler or a hand edit of `param_groups`
takes effect at the next step without a new search.

Names: group scalars are 'g<i>:<what>' (lr, weight decay, betas, eps, momentum),
per-parameter ones '<param>:<what>' (Adam's bias corrections, which depend on that
parameter's step count; SGD's first-step momentum factors).

Gradient clipping repeats `torch.nn.utils.clip_grad_norm_` (one `linalg_vector_norm` and
one `mul_` per gradient, traced as the shares of the `torch._foreach_norm` and
`torch._foreach_mul_` it calls on every device with foreach support, a CPU included:
capture.list_update), and a GradScaler's unscale repeats `GradScaler.unscale_`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.optim.optimizer import Optimizer
from torch.utils._foreach_utils import _device_has_foreach_support

from peakcut.capture.list_update import Runs, foreach_adam, foreach_sgd, fused_adam
from peakcut.capture.trace import TraceLog
from peakcut.ir.node import Hyper
from peakcut.spec.optimizers import GroupSpec, OptimizerSpec

_SENTINEL = 1.2345678901234567e-77   # far below any real hyper-parameter or constant
CLIP_EPS = 1e-6                      # torch.nn.utils.clip_grad_norm_'s epsilon


class HyperTable:
    """Unique sentinel floats for the trace, and the names they stand for."""

    def __init__(self) -> None:
        self.names: dict[float, str] = {}
        self.values: dict[str, float] = {}     # capture-time values (what analyses see)
        self._sentinels: dict[str, float] = {}

    def __call__(self, name: str, value: float) -> float:
        found = self._sentinels.get(name)
        if found is None:
            found = self._sentinels[name] = _SENTINEL * (len(self._sentinels) + 2)
            self.names[found] = name
            self.values[name] = float(value)
        return found


def substitute_hypers(gm: torch.fx.GraphModule, hypers: HyperTable) -> None:
    """Sentinel floats of a trace -> ir Hyper scalars (name + capture-time value), in place.

    Every hyper-parameter must reach the graph verbatim as an op argument: one that only
    entered arithmetic in the trace (a bug in traced_update) would be a constant, so it is
    refused. Other floats (a model's own constants) are left alone.
    """
    found: set[str] = set()

    def swap(v: Any) -> Any:
        if isinstance(v, float) and not isinstance(v, Hyper):
            name = hypers.names.get(v)
            if name is not None:
                found.add(name)
                return Hyper(name, hypers.values[name])
        return v

    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.args = torch.fx.node.map_aggregate(node.args, swap)
            node.kwargs = torch.fx.node.map_aggregate(node.kwargs, swap)
    missing = sorted(set(hypers.values) - found)
    if missing:
        raise ValueError(f"internal: hyper-parameters {missing[:3]} entered arithmetic inside the traced "
                         "update instead of being op arguments; they cannot be run-time inputs")


# ----------------------------------------------------------------------------- traced update
def clip_by_total_norm(grads: Sequence[torch.Tensor], max_norm: float, log: TraceLog | None = None,
                       reduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor | None:
    """torch.nn.utils.clip_grad_norm_(norm_type=2, foreach=None) on these gradients, in place:
    per device/dtype group (in torch's grouping order), the norms and the scaling as the list
    ops it calls where the device supports them (torch._foreach_norm, torch._foreach_mul_: on
    a CPU and a GPU; recorded as runs in `log`), else one call per gradient. Returns the total
    norm before clipping, as clip_grad_norm_ does (None without gradients). `reduce`: this
    rank's total norm -> the norm over every rank's shards (FSDP2)."""
    if not grads:
        return None
    runs = Runs(log)
    groups = _grouped(grads)
    first = grads[0].device
    norms: list = []
    for device, group in groups:
        if _device_has_foreach_support(device):      # the real gradients are plain tensors
            norms.extend(runs.each("_foreach_norm", [group], lambda g: torch.linalg.vector_norm(g, 2.0)))
        else:
            norms.extend(torch.linalg.vector_norm(g, 2.0) for g in group)
    total_norm = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), 2.0)
    if reduce is not None:
        total_norm = reduce(total_norm)
    clip_coef = max_norm / (total_norm + CLIP_EPS)
    clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
    for device, group in groups:
        coef = clip_coef_clamped.to(device)
        if _device_has_foreach_support(device):
            runs.each("_foreach_mul_", [group], lambda g, coef=coef: g.mul_(coef))
        else:
            for g in group:
                g.mul_(coef)
    return total_norm


def _grouped(tensors: Sequence[torch.Tensor]) -> list[tuple[torch.device, list[torch.Tensor]]]:
    """The tensors by device and dtype, in torch's grouping order (clip_grad_norm_'s): each
    group's device and tensors."""
    listed: list[torch.Tensor | None] = list(tensors)
    found = Optimizer._group_tensors_by_device_and_dtype([listed], with_indices=True)
    return [(tensors[indices[0]].device, [tensors[i] for i in indices]) for _, (_, indices) in found.items()]


def unscale(grads: Sequence[torch.Tensor], scale: torch.Tensor, log: TraceLog | None = None) -> torch.Tensor:
    """GradScaler.unscale_: divide the gradients by the scale in place; returns found_inf. One call
    per gradient, the shares of GradScaler's one call per device/dtype group (runs in `log`)."""
    inv_scale = scale.double().reciprocal().float()
    found_inf = torch.full((), 0.0, dtype=torch.float32, device=scale.device)
    op = "_amp_foreach_non_finite_check_and_unscale_"
    for _, group in _grouped(grads):
        Runs(log).each(op, [group], lambda g: torch._amp_foreach_non_finite_check_and_unscale_([g], found_inf,
                                                                                               inv_scale))
    return found_inf


def slot_like(param: torch.Tensor, slot: str) -> torch.Tensor:
    """A new state tensor `slot` of `param`, as torch.optim makes it (the fused kernel's step
    count: a float32 scalar beside the parameter)."""
    if slot == "step":
        return torch.zeros((), dtype=torch.float32, device=param.device)
    return torch.zeros_like(param, memory_format=torch.preserve_format)


def traced_update(spec: OptimizerSpec, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
                  state: Mapping[str, Mapping[str, torch.Tensor]], hp: HyperTable, log: TraceLog | None = None,
                  ) -> None:
    """One optimizer step in place, as torch.optim runs it for each group (module doc); `log`
    records the list ops of foreach and fused groups (TraceLog.runs)."""
    runs = Runs(log)
    for gi, group in enumerate(spec.groups):
        if group.impl != "single":
            names = [n for n in group.params if n in grads]
            if not names:
                continue
            decoupled = group.flag("decoupled_weight_decay")
            if spec.kind == "sgd":
                foreach_sgd(gi, group, names, params, grads, state, hp, runs)
            elif group.impl == "foreach":
                foreach_adam(decoupled, gi, group, names, params, grads, state, hp, runs)
            else:
                fused_adam(decoupled, gi, group, names, params, grads, state, hp, runs)
            continue
        for name in group.params:
            if name not in grads:
                continue      # no gradient: torch.optim skips the parameter
            if spec.kind == "sgd":
                _sgd(gi, group, name, params[name], grads[name], state[name], hp)
            else:
                _adam(group.flag("decoupled_weight_decay"), gi, group, name, params[name], grads[name],
                      state[name], hp)


def _sgd(gi: int, group: GroupSpec, name: str, param: torch.Tensor, grad: torch.Tensor,
         slots: Mapping[str, torch.Tensor], hp: HyperTable) -> None:
    h = group.hyper
    if group.flag("maximize"):
        grad = -grad
    if h["weight_decay"] != 0:
        grad = grad.add(param, alpha=hp(f"g{gi}:weight_decay", h["weight_decay"]))
    if h["momentum"] != 0:
        buf = slots["momentum_buffer"]
        # the first step (no buffer yet) runs with factors 0 and 1: buf = 0 * 0 + 1 * grad
        buf.mul_(hp(f"{name}:momentum_factor", h["momentum"])).add_(
            grad, alpha=hp(f"{name}:grad_factor", 1 - h["dampening"]))
        if group.flag("nesterov"):
            grad = grad.add(buf, alpha=hp(f"g{gi}:momentum", h["momentum"]))
        else:
            grad = buf
    param.add_(grad, alpha=hp(f"g{gi}:neg_lr", -h["lr"]))


def _adam(decoupled: bool, gi: int, group: GroupSpec, name: str, param: torch.Tensor, grad: torch.Tensor,
          slots: Mapping[str, torch.Tensor], hp: HyperTable) -> None:
    h = group.hyper
    if group.flag("maximize"):
        grad = -grad
    if h["weight_decay"] != 0:
        if decoupled:
            param.mul_(hp(f"g{gi}:decay", 1 - h["lr"] * h["weight_decay"]))
        else:
            grad = grad.add(param, alpha=hp(f"g{gi}:weight_decay", h["weight_decay"]))
    exp_avg, exp_avg_sq = slots["exp_avg"], slots["exp_avg_sq"]
    exp_avg.lerp_(grad, hp(f"g{gi}:one_minus_beta1", 1 - h["beta1"]))
    exp_avg_sq.mul_(hp(f"g{gi}:beta2", h["beta2"])).addcmul_(
        grad, grad, value=hp(f"g{gi}:one_minus_beta2", 1 - h["beta2"]))
    bias_correction2_sqrt = hp(f"{name}:bias_correction2_sqrt", (1 - h["beta2"]) ** 0.5)
    if group.flag("amsgrad"):
        max_sq = slots["max_exp_avg_sq"]
        max_sq.copy_(torch.maximum(max_sq, exp_avg_sq))   # torch.maximum(..., out=max_sq): same values
        denom = (max_sq.sqrt() / bias_correction2_sqrt).add_(hp(f"g{gi}:eps", h["eps"]))
    else:
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(hp(f"g{gi}:eps", h["eps"]))
    param.addcdiv_(exp_avg, denom, value=hp(f"{name}:neg_step_size", -h["lr"] / (1 - h["beta1"])))
