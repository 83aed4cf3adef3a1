"""Optimizer updates traced into the step, matching torch.optim's numbers.

The update is written with in-place tensor ops so that the captured graph
updates parameters and state in their own storage, like optimizer.step().
State starts at zero (momentum, Adam moments, step count): with dampening 0
this gives exactly torch.optim's first step, which clones the gradient into
the momentum buffer (0 * momentum + grad == grad).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class SGD:
    """torch.optim.SGD (foreach=False) hyper-parameters; dampening must be 0."""

    lr: float = 1e-2
    momentum: float = 0.0
    weight_decay: float = 0.0
    nesterov: bool = False
    kind: str = "sgd"

    def slots(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()

    def shared_slots(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class AdamW:
    """torch.optim.AdamW (foreach=False, amsgrad=False) hyper-parameters."""

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 1e-2
    kind: str = "adamw"

    def slots(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def shared_slots(self) -> tuple[str, ...]:
        return ("step",)


OptimizerSpec = SGD | AdamW


def parse_optimizer(optimizer: object) -> OptimizerSpec | None:
    """None, "sgd", "adamw", an SGD/AdamW spec, or a torch.optim.SGD/AdamW instance."""
    if optimizer is None or isinstance(optimizer, (SGD, AdamW)):
        return optimizer
    if isinstance(optimizer, str):
        key = optimizer.lower()
        if key == "sgd":
            return SGD(momentum=0.9)
        if key == "adamw":
            return AdamW()
        raise ValueError(f"optimizer={optimizer!r}: expected 'sgd', 'adamw' or None")
    if isinstance(optimizer, torch.optim.Optimizer):
        return _from_torch(optimizer)
    raise TypeError(f"optimizer: expected None, 'sgd', 'adamw' or a torch.optim optimizer, got {type(optimizer).__name__}")


def spec_from_dict(d: dict) -> OptimizerSpec | None:
    if not d:
        return None
    kind = d.get("kind")
    if kind == "sgd":
        return SGD(**d)
    if kind == "adamw":
        return AdamW(**d)
    raise ValueError(f"unknown optimizer kind {kind!r}")


def spec_to_dict(spec: OptimizerSpec | None) -> dict:
    return {} if spec is None else asdict(spec)


def _from_torch(opt: torch.optim.Optimizer) -> OptimizerSpec:
    if len(opt.param_groups) != 1:
        raise ValueError(f"{type(opt).__name__}: only one param group is supported, got {len(opt.param_groups)}")
    g = opt.param_groups[0]
    for flag in ("maximize", "differentiable", "amsgrad", "capturable"):
        if g.get(flag):
            raise ValueError(f"{type(opt).__name__}: {flag}=True is not supported")
    if isinstance(opt, torch.optim.AdamW):
        b1, b2 = g["betas"]
        return AdamW(lr=float(g["lr"]), beta1=float(b1), beta2=float(b2), eps=float(g["eps"]),
                     weight_decay=float(g["weight_decay"]))
    if isinstance(opt, torch.optim.SGD):
        if g.get("dampening", 0):
            raise ValueError("SGD: dampening != 0 is not supported (its first step differs)")
        return SGD(lr=float(g["lr"]), momentum=float(g["momentum"]), weight_decay=float(g["weight_decay"]),
                   nesterov=bool(g["nesterov"]))
    raise TypeError(f"unsupported optimizer {type(opt).__name__}: use SGD or AdamW")


def init_state(spec: OptimizerSpec, params: Sequence[torch.Tensor]) -> tuple[list[list[torch.Tensor]], list[torch.Tensor]]:
    """Fresh state: per-param slot tensors (zeros like the param) and shared tensors (step)."""
    per_param = [[torch.zeros_like(p) for _ in spec.slots()] for p in params]
    device = params[0].device if params else torch.device("cpu")
    shared = [torch.zeros((), dtype=torch.float32, device=device) for _ in spec.shared_slots()]
    return per_param, shared


def apply_update(
    spec: OptimizerSpec,
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    state: Sequence[Sequence[torch.Tensor]],
    shared: Sequence[torch.Tensor],
) -> None:
    """One optimizer step, in place, in torch.optim's single-tensor order of operations."""
    if isinstance(spec, SGD):
        _sgd(spec, params, grads, state)
    else:
        _adamw(spec, params, grads, state, shared[0])


def _sgd(spec: SGD, params, grads, state) -> None:
    for p, g, slots in zip(params, grads, state, strict=True):
        d_p = g
        if spec.weight_decay:
            d_p = d_p.add(p, alpha=spec.weight_decay)
        if spec.momentum:
            buf = slots[0]
            buf.mul_(spec.momentum).add_(d_p)
            d_p = d_p.add(buf, alpha=spec.momentum) if spec.nesterov else buf
        p.add_(d_p, alpha=-spec.lr)


def _adamw(spec: AdamW, params, grads, state, step: torch.Tensor) -> None:
    step.add_(1)
    s = step.to(torch.float64)
    bias_correction1 = 1 - torch.pow(spec.beta1, s)
    bias_correction2_sqrt = (1 - torch.pow(spec.beta2, s)).sqrt()
    neg_step_size = (-spec.lr) / bias_correction1
    for p, g, (exp_avg, exp_avg_sq) in zip(params, grads, state, strict=True):
        if spec.weight_decay:
            p.mul_(1 - spec.lr * spec.weight_decay)
        exp_avg.lerp_(g, 1 - spec.beta1)
        exp_avg_sq.mul_(spec.beta2).addcmul_(g, g, value=1 - spec.beta2)
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(spec.eps)
        p.addcdiv_(exp_avg * neg_step_size, denom)
