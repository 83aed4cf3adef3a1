"""The values of the update's run-time scalars for the next step, read from the user's optimizer.

The traced update (capture.update) reads every hyper-parameter as a named run-time scalar
(`ir.node.Hyper`). At every call the step computes their values from the user's optimizer
(`param_groups`, per-parameter step counts and momentum buffers) with the same Python float
arithmetic as torch.optim, so an LR scheduler or a hand edit of `param_groups` takes effect at
the next step. Names: group scalars are 'g<i>:<what>', per-parameter ones '<param>:<what>'.
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
            continue
        beta1, beta2 = (_number(b, "betas") for b in live["betas"])
        out[f"g{gi}:decay"] = 1 - lr * wd
        out[f"g{gi}:weight_decay"] = wd
        out[f"g{gi}:one_minus_beta1"] = 1 - beta1
        out[f"g{gi}:beta2"] = beta2
        out[f"g{gi}:one_minus_beta2"] = 1 - beta2
        out[f"g{gi}:eps"] = _scalar(live, "eps")
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


def _scalar(group: Mapping[str, Any], key: str) -> float:
    return _number(group[key], key)


def _number(v: Any, key: str) -> float:
    if isinstance(v, torch.Tensor):
        raise ValueError(f"param_groups[...]['{key}'] is a Tensor: peakcut supports Python-number "
                         "hyper-parameters only (a tensor lr changes torch.optim's arithmetic)")
    return float(v)
