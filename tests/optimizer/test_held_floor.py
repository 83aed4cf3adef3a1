"""A memory limit below what the step holds between steps is refused at once on a CPU."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import peakcut
from peakcut.memory.step import simulate
from peakcut.optimizer import LimitNotMet, optimize_graph
from peakcut.optimizer.children import MoveSettings
from peakcut.optimizer.held_floor import held_floor_refusal, whole_op_floor
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


@pytest.fixture
def narrow() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """Few parameters, wide activations: a GELU's backward (three 2 MiB tensors at once) is
    most of the peak above what the step holds."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 2048), nn.GELU(), nn.Linear(2048, 10))
    return model, (torch.randn(256, 32), torch.randint(0, 10, (256,)))


def test_the_largest_op_run_whole_is_a_floor_on_the_host(narrow: tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Below what the step holds plus the largest op's own inputs, outputs and scratch, no plan
    that runs that op whole meets the limit: the op is named with the figures, and the
    sentence ends LimitNotMet (nothing is refused: a split could still meet it)."""
    model, batch = narrow
    g = peakcut.capture(model, batch, cross_entropy_loss, "adamw")
    eager = simulate(g)
    activation = 256 * 2048 * 4
    assert eager.baseline_bytes + 3 * activation < eager.peak_bytes
    limit = eager.baseline_bytes + 2 * activation        # above what is held, below held + the GELU's backward
    whole = whole_op_floor(g, limit, "analytic:cpu")
    assert whole is not None and whole.held_bytes == eager.baseline_bytes and whole.limit_bytes == limit
    assert whole.op.startswith("gelu_backward") and whole.op_bytes >= 3 * activation
    assert whole.floor_bytes == whole.held_bytes + whole.op_bytes > limit
    assert "split" in whole.text and "gelu_backward" in whole.text
    assert whole_op_floor(g, whole.floor_bytes, "analytic:cpu") is None
    assert whole_op_floor(g, limit, "h200") is None              # offload and swaps move the held bytes
    assert held_floor_refusal(g, limit, "analytic:cpu") is None  # above the held floor: searched
    with pytest.raises(LimitNotMet, match="gelu_backward .* needs .* a plan must split or rewrite that op") as caught:
        peakcut.optimize(model, batch, cross_entropy_loss, "adamw", memory_limit=limit, device="cpu",
                         time_budget=5, settings=MoveSettings.only("remat"))
    assert caught.value.plan.report["whole_op_floor"]["op_bytes"] == whole.op_bytes
