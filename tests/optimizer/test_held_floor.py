"""A memory limit below what the step holds between steps is refused at once on a CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import peakcut
from peakcut.memory.step import simulate
from peakcut.optimizer import LimitNotMet, optimize_graph
from peakcut.optimizer.held_floor import held_floor_refusal
from tests.helpers import cross_entropy_loss


@pytest.fixture
def wide() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """Parameters and AdamW moments are most of the peak: the held floor is above 50%."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))
    return model, (torch.randn(4, 256), torch.randint(0, 10, (4,)))


def test_the_floor_is_the_bytes_held_between_steps(wide) -> None:
    model, batch = wide
    g = peakcut.capture(model, batch, cross_entropy_loss, "adamw")
    eager = simulate(g)
    floor = eager.baseline_bytes / eager.peak_bytes
    assert floor > 0.5
    refused = held_floor_refusal(g, 0.5, "measured:cpu")
    assert refused is not None and refused.held_bytes == eager.baseline_bytes
    assert refused.limit_bytes == int(0.5 * eager.peak_bytes)
    assert "parameters" in refused.text and "optimizer state" in refused.text and "batch" in refused.text
    assert held_floor_refusal(g, min(1.0, floor + 0.01), "measured:cpu") is None
    assert held_floor_refusal(g, 0.5, "h200") is None          # offload moves them there
    assert held_floor_refusal(g, None, "measured:cpu") is None


def test_optimize_graph_does_not_search_below_the_floor(wide) -> None:
    model, batch = wide
    g = peakcut.capture(model, batch, cross_entropy_loss, "adamw")
    found = optimize_graph(g, memory_limit=0.5, device="cpu", time_budget=30)
    assert not found.feasible
    assert found.result.states == 1
    assert "below the" in found.report["unreachable"]["text"]
    assert found.report["search"]["stopped"].startswith("not searched")
    searched = optimize_graph(g, memory_limit=0.5, device="h200", time_budget=2, max_states=10)
    assert "unreachable" not in searched.report


def test_optimize_refuses_before_calibrating_and_hands_back_the_untransformed_step(wide) -> None:
    model, batch = wide
    ref = copy.deepcopy(model)
    with pytest.raises(LimitNotMet, match="not searched: the limit .* below the .* the step holds between steps") as caught:
        peakcut.optimize(model, batch, cross_entropy_loss, "adamw", memory_limit=0.5, device="measured",
                         time_budget=30)
    plan = caught.value.plan
    assert "context" not in plan.report and "verification" not in plan.report
    assert plan.report["applied"] == []
    opt = torch.optim.AdamW(ref.parameters())
    for _ in range(2):
        expected = cross_entropy_loss(ref, batch)
        expected.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.testing.assert_close(plan.step(batch), expected.detach())
