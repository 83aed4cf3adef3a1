"""The values of the update's run-time scalars for the next step, read from the user's optimizer.

The traced update (capture.update) reads every hyper-parameter as a named run-time scalar
(`ir.node.Hyper`). At every call the step computes their values from the user's optimizer
(`param_groups`, per-parameter step counts and momentum buffers) with the same Python float
arithmetic as torch.optim, so an LR scheduler or a hand edit of `param_groups` takes effect at
the next step. Names: group scalars are 'g<i>:<what>', per-parameter ones '<param>:<what>'.
Which of them a graph reads depends on each group's implementation (spec.optimizers.IMPLS);
every one is computed, and the step reads its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from peakcut.spec.optimizers import OptimizerSpec


def scalars(spec: OptimizerSpec, groups: Sequence[Mapping[str, Any]],
            steps: Mapping[str, float], first: Mapping[str, bool]) -> dict[str, float]:
    """The values of every run-time scalar for the next step, as torch.optim computes them.

    groups: the user's optimizer.param_groups (already matched to spec.groups);
    steps: parameter -> its step count after this step (Adam); first: parameter -> True
    when it has no momentum buffer yet (SGD).
    """
    out: dict[str, float] = {}
    for gi, (group, live) in enumerate(zip(spec.groups, groups, strict=True)):
        lr = _scalar(live, "lr")
        wd = _scalar(live, "weight_decay")
        if spec.kind == "sgd":
            momentum, dampening = _scalar(live, "momentum"), _scalar(live, "dampening")
            out[f"g{gi}:weight_decay"] = wd
            out[f"g{gi}:momentum"] = momentum
            out[f"g{gi}:neg_lr"] = -lr
            for name in group.params:
                is_first = first.get(name, False)
                out[f"{name}:momentum_factor"] = 0.0 if is_first else momentum
                out[f"{name}:grad_factor"] = 1.0 if is_first else 1 - dampening
            if group.impl != "single":
                out[f"g{gi}:grad_factor"] = _group_grad_factor(gi, group.params, first, dampening)
            continue
        beta1, beta2 = (_number(b, "betas") for b in live["betas"])
        out[f"g{gi}:decay"] = 1 - lr * wd
        out[f"g{gi}:weight_decay"] = wd
        out[f"g{gi}:one_minus_beta1"] = 1 - beta1
        out[f"g{gi}:beta2"] = beta2
        out[f"g{gi}:one_minus_beta2"] = 1 - beta2
        out[f"g{gi}:eps"] = _scalar(live, "eps")
        out[f"g{gi}:lr"] = lr                   # the fused kernel's arguments
        out[f"g{gi}:beta1"] = beta1
        for name in group.params:
            if name not in steps:
                continue
            step = steps[name]
            bias_correction1 = 1 - beta1 ** step
            bias_correction2 = 1 - beta2 ** step
            step_size = lr / bias_correction1
            out[f"{name}:bias_correction2_sqrt"] = bias_correction2 ** 0.5
            out[f"{name}:neg_step_size"] = -step_size
    return out


def _group_grad_factor(gi: int, names: Sequence[str], first: Mapping[str, bool], dampening: float) -> float:
    """SGD's gradient factor for a whole foreach group (its list op takes one alpha): 1 where every
    parameter makes its momentum buffer now (torch.optim copies the gradient), 1 - dampening
    where none does."""
    made = {first.get(name, False) for name in names}
    if len(made) > 1 and dampening != 0:
        raise ValueError(f"param group {gi}: some parameters have a momentum buffer and some make theirs at "
                         "this step, with dampening != 0: the foreach update adds their gradients with two "
                         "factors, which peakcut's one list call cannot; plan with foreach=False")
    return 1.0 if made == {True} else 1 - dampening


def _scalar(group: Mapping[str, Any], key: str) -> float:
    return _number(group[key], key)


def _number(v: Any, key: str) -> float:
    if isinstance(v, torch.Tensor):
        raise ValueError(f"param_groups[...]['{key}'] is a Tensor: peakcut supports Python-number "
                         "hyper-parameters only (a tensor lr changes torch.optim's arithmetic)")
    return float(v)
