"""The seven workloads (tiny) trained with the user's AdamW in foreach mode: eager's numbers.

The untransformed program (its update written as torch._foreach_* calls) and the eager loop
with the same torch.optim.AdamW(foreach=True) run 2 steps from the same state and seeds;
loss and parameters agree within tests.tolerance for float32 over reductions of 256.
"""

from __future__ import annotations

import copy

import pytest
import torch

import peakcut
from peakcut.workloads import WORKLOAD_NAMES, get_workload
from tests.tolerance import tolerance

STEPS = 2
TOL = tolerance(torch.float32, 256, STEPS)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_tiny_workload_with_a_foreach_adamw_matches_eager(name: str) -> None:
    inst = get_workload(name).build("tiny")
    model = inst.model
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)
    step = peakcut.build(peakcut.capture(model, inst.batch, inst.loss_fn, opt), optimizer=opt)
    assert "torch._foreach_lerp_(" in step.source
    for k in range(STEPS):
        torch.manual_seed(k)
        loss = step(model, inst.batch)
        torch.manual_seed(k)
        ref_loss = inst.loss_fn(ref, inst.batch)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=TOL, atol=TOL)
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=TOL, atol=TOL, msg=lambda m, pname=pname: f"{pname}: {m}")
