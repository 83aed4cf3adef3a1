"""optimize's default arena: on for a single-process step on a CPU with at least 64 MiB of
transient bytes (its heap would split around them), off for a smaller step and with
accumulation, and the plan it runs gives the numbers of the same plan without one, bit for
bit. A plan holds one batch shape's arena at a time."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import peakcut
from peakcut.cost import get_cost_model
from peakcut.integrations.transformers_settings import PeakcutSettings
from peakcut.optimizer.arena import ARENA_MIN_BYTES, arena_by_default
from peakcut.simulate import simulate_timeline
from tests.helpers import cross_entropy_loss, make_mlp


def _mlp(rows: int) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 10))
    return model, (torch.randn(rows, 256), torch.randint(0, 10, (rows,)))


def _transient(rows: int) -> tuple[bool, int]:
    model, batch = _mlp(rows)
    g = peakcut.capture(model, batch, cross_entropy_loss, "sgd")
    eager = simulate_timeline(g, g.order, get_cost_model("cpu"), "auto")
    return arena_by_default(g, eager), eager.peak_bytes - eager.baseline_bytes


def test_the_default_is_an_arena_from_64_mib_of_transient_bytes_on_a_cpu() -> None:
    small, small_bytes = _transient(64)
    big, big_bytes = _transient(8192)              # 32 MiB a hidden activation
    assert small_bytes < ARENA_MIN_BYTES <= big_bytes
    assert not small and big


def test_optimize_runs_a_large_cpu_step_in_its_arena_with_the_same_numbers() -> None:
    model, batch = _mlp(8192)
    runs = {}
    for arena in (None, False):
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        plan = peakcut.optimize(m, batch, cross_entropy_loss, opt, device="cpu", time_budget=20, max_states=2,
                                latency_limit=1.10, **({} if arena is None else {"arena": arena}))
        assert ("arena" in plan.report) is (arena is None)
        assert (plan.program.arena_plan is not None) is (arena is None)
        loss = plan.step(batch)
        runs[arena] = (loss, [p.detach().clone() for p in m.parameters()], plan.order)
    (loss_a, params_a, order_a), (loss_b, params_b, order_b) = runs[None], runs[False]
    assert order_a == order_b                      # the same plan, with and without its arena
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(a, b) for a, b in zip(params_a, params_b, strict=True))
    small, small_batch = _mlp(64)
    plan = peakcut.optimize(small, small_batch, cross_entropy_loss, "sgd", device="cpu", time_budget=5, max_states=2)
    assert "arena" not in plan.report and plan.program.arena_plan is None


def test_no_default_arena_with_accumulation_and_the_trainer_setting_is_checked() -> None:
    model, batch = _mlp(8192)
    plan = peakcut.optimize(model, batch, cross_entropy_loss, "sgd", device="cpu", time_budget=10, max_states=2,
                            accumulate=2)
    assert "arena" not in plan.report and plan.program.arena_plan is None
    assert PeakcutSettings.from_argument({"arena": False}).search()["arena"] is False
    with pytest.raises(ValueError, match="arena="):
        PeakcutSettings.from_argument({"arena": "yes"})


def test_a_plan_holds_the_arena_of_the_batch_shape_it_runs() -> None:
    model, batch = make_mlp()
    short = tuple(t[: len(t) // 2] for t in batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = peakcut.optimize(model, batch, cross_entropy_loss, opt, device="cpu", time_budget=10, max_states=2,
                            arena=True)
    eager = copy.deepcopy(model)
    eager_opt = torch.optim.SGD(eager.parameters(), lr=0.1)
    for b in (batch, short, batch):
        loss = plan.step(b)
        eager_opt.zero_grad()
        expected = cross_entropy_loss(eager, b)
        expected.backward()
        eager_opt.step()
        torch.testing.assert_close(loss, expected)
        held = [step.arena is not None for steps in plan._steps.values() for step in steps if step is not None]
        assert held.count(True) == 1                # the other shape's arena is given back
    assert len(plan._steps) == 2
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p, q)
