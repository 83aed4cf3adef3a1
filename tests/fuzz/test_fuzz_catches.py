"""The fuzz comparison catches a wrong step: a loss scaled by a little more than rounding
could explain gives a report that is not ok, in float64 (elementwise) and under bf16
autocast (norm-wise, against eager's distance from the precise loop), and the same step
without the planted error is ok."""

from __future__ import annotations

import pytest
import torch

import peakcut
from bench.fuzz.harness import STEPS
from bench.fuzz.loop import autocast_tolerance, run_user_loop
from bench.fuzz.models import Case, make_case
from peakcut.runtime.equivalence import rounding_tolerance


def _first(autocast: bool) -> Case:
    for seed in range(200):
        case = make_case(seed)
        if case.autocast == autocast and (autocast or case.dtype == torch.float64):
            return case
    raise LookupError("no such case among seeds 0-199")


@pytest.mark.parametrize(("autocast", "scale"), [(False, 1 + 1e-9), (True, 1.05)], ids=["float64", "bf16 autocast"])
def test_a_planted_error_is_caught_and_its_absence_passes(autocast: bool, scale: float) -> None:
    case = _first(autocast)
    loop = case.as_user_loop()

    def report(factor: float) -> bool:
        def loss_fn(m: torch.nn.Module, b: object) -> torch.Tensor:
            return case.loss_fn(m, b) * factor
        g = peakcut.capture(case.model, case.batch, loss_fn, loop.make_optimizer(case.model),
                            keep_grads=True, max_grad_norm=loop.max_grad_norm)
        largest = max(t.numel for t in g.tensors.values())
        tol = autocast_tolerance(STEPS) if autocast else rounding_tolerance(case.dtype, largest, STEPS)
        out = run_user_loop(case.model, case.batch, case.loss_fn, loop,
                            lambda _m, opt: peakcut.build(g, optimizer=opt), STEPS, tol, seed=case.seed,
                            precise_loss_fn=case.precise_loss_fn)
        return out.ok

    assert report(1.0), case.description
    assert not report(scale), case.description
