"""The number check: a configuration's first step against eager's first step from the same
weights, norm-wise relative over all parameters together, in float64: the loss, the
optimizer state (AdamW's first and second moments) and the updates (new - initial weights).

Eager's results are kept on the host (Reference); a configuration's are compared where they
are, one parameter at a time, so nothing of the size of the model is copied twice.
Tolerance: float32 rounding of a reduction of the step's longest weight-gradient sum
(peakcut.runtime.equivalence.rounding_tolerance); a half-precision result is rounded once
more from float32 accumulation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.runtime.equivalence import rounding_tolerance

STATE = ("exp_avg", "exp_avg_sq")


@dataclass
class Reference:
    """Step 1 of the reference configuration on the host: loss, parameters and optimizer
    state by parameter name; `init` the weights before it; `source` which configuration ran it."""

    source: str
    loss: torch.Tensor
    params: dict[str, torch.Tensor]
    state: dict[str, dict[str, torch.Tensor]]
    init: dict[str, torch.Tensor]


def host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


def reference(source: str, model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor,
              init: dict[str, torch.Tensor]) -> Reference:
    params = dict(model.named_parameters())
    state = {key: {n: host_copy(opt.state[p][key]) for n, p in params.items() if key in opt.state.get(p, {})}
             for key in STATE}
    return Reference(source, host_copy(loss).double(), {n: host_copy(p) for n, p in params.items()}, state, init)


def tolerance(dtype: torch.dtype, reduction: int) -> float:
    tol = rounding_tolerance(torch.float32, reduction)
    if dtype in (torch.float16, torch.bfloat16):
        tol += rounding_tolerance(dtype, 1)
    return tol


class _Norms:
    """||a - b||^2 and ||b||^2 summed over pairs, in float64 on the pair's device."""

    def __init__(self) -> None:
        self.diff = self.scale = 0.0

    def add(self, a: torch.Tensor, b: torch.Tensor) -> float:
        a, b = a.double(), b.to(a.device).double()
        diff, scale = (a - b).square().sum().item(), b.square().sum().item()
        self.diff += diff
        self.scale += scale
        return math.sqrt(diff / scale) if scale > 0 else math.sqrt(diff)

    @property
    def relative(self) -> float:
        return math.sqrt(self.diff / self.scale) if self.scale > 0 else math.sqrt(self.diff)


def check(ref: Reference, model: torch.nn.Module, opt: torch.optim.Optimizer, loss: Any, tol: float) -> dict[str, Any]:
    """A configuration's step 1 (model, opt after it; its loss) against `ref` (module doc)."""
    params = dict(model.named_parameters())
    missing = sorted(n for n in ref.state["exp_avg"] if n not in params or "exp_avg" not in opt.state.get(params[n], {}))
    if missing:
        return {"reference": ref.source, "tolerance": tol, "equal": False,
                "why": f"no optimizer state after the step for {missing[:3]}"}
    figures: dict[str, Any] = {}
    with torch.no_grad():
        norms = _Norms()
        norms.add(torch.as_tensor(loss).detach().reshape(()), ref.loss)
        figures["loss"] = norms.relative
        worst = (0.0, "")
        for key in STATE:
            norms = _Norms()
            for n, b in ref.state[key].items():
                rel = norms.add(opt.state[params[n]][key], b)
                if key == "exp_avg":
                    worst = max(worst, (rel, n))
            figures[key] = norms.relative
        norms = _Norms()
        for n, b in ref.params.items():
            p = params[n].detach()
            init = ref.init[n].to(p.device).double()
            norms.add(p.double() - init, b.to(p.device).double() - init)
        figures["updates"] = norms.relative
    return {"reference": ref.source, "tolerance": tol, **figures,
            "equal": all(v <= tol for v in figures.values()),
            "worst_parameter_moments": {"name": worst[1], "relative": worst[0]}}
