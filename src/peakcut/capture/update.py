"""The optimizer update as traced into the step.

The traced update repeats torch.optim's single-tensor code (`_single_tensor_sgd`,
`_single_tensor_adam`) op for op, with every hyper-parameter a run-time scalar:
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

Gradient clipping repeats `torch.nn.utils.clip_grad_norm_` (foreach on CPU runs one
`linalg_vector_norm` and one `mul_` per gradient, which is what is traced), and a
GradScaler's unscale repeats `GradScaler.unscale_`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

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
def clip_by_total_norm(grads: Sequence[torch.Tensor], max_norm: float) -> None:
    """torch.nn.utils.clip_grad_norm_(norm_type=2) on these gradients, in place."""
    if not grads:
        return
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        groups.setdefault((g.device, g.dtype), []).append(g)
    first = grads[0].device
    norms = [torch.linalg.vector_norm(g, 2.0) for group in groups.values() for g in group]
    total_norm = torch.linalg.vector_norm(torch.stack([n.to(first) for n in norms]), 2.0)
    clip_coef = max_norm / (total_norm + CLIP_EPS)
    clip_coef_clamped = torch.clamp(clip_coef, max=1.0)
    for (device, _), group in groups.items():
        coef = clip_coef_clamped.to(device)
        for g in group:
            g.mul_(coef)


def unscale(grads: Sequence[torch.Tensor], scale: torch.Tensor) -> torch.Tensor:
    """GradScaler.unscale_: divide the gradients by the scale in place; returns found_inf."""
    inv_scale = scale.double().reciprocal().float()
    found_inf = torch.full((), 0.0, dtype=torch.float32, device=scale.device)
    for g in grads:
        torch._amp_foreach_non_finite_check_and_unscale_([g], found_inf, inv_scale)
    return found_inf


def traced_update(spec: OptimizerSpec, params: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor],
                  state: Mapping[str, Mapping[str, torch.Tensor]], hp: HyperTable) -> None:
    """One optimizer step in place, as torch.optim's single-tensor code does it."""
    for gi, group in enumerate(spec.groups):
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
