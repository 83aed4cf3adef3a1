"""peakcut.optimize on small models: limits, budgets, determinism, save/load, inference."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.optimizer import LimitNotMet, optimize_graph
from peakcut.optimizer.plan import plan_contents
from peakcut.optimizer.state import computation_hash
from peakcut.rules import RULES
from tests.helpers import cross_entropy_loss as mlp_loss


class MLP(nn.Module):
    def __init__(self, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return self.head(x)


@pytest.fixture
def mlp() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return MLP(), (torch.randn(32, 64), torch.randint(0, 10, (32,)))


def test_the_plan_keeps_the_numbers_of_eager(mlp) -> None:
    model, batch = mlp
    plan = peakcut.optimize(copy.deepcopy(model), batch, mlp_loss, "adamw", latency_limit=1.5,
                            device="rtx3090", time_budget=10, max_states=40, keep_grads=True)
    report = peakcut.check_equivalence(model, batch, mlp_loss, peakcut.AdamW(),
                                       lambda _m: Step(plan.graph, plan.order), steps=3)
    assert report.ok, report
    r = plan.report
    assert r["peak_bytes"] <= r["eager_peak_bytes"]
    assert {"eager_peak_bytes", "peak_bytes", "eager_latency_s", "latency_s", "memory_method",
            "latency_method", "applied", "rewrites", "fission", "recipes"} <= set(r)
    assert "simulated" in r["memory_method"] and "rtx3090" in r["latency_method"]
    assert "def step(" in plan.source
    contents = plan_contents(r)      # what the plan does: no undo, nothing dropped
    assert len(contents) == len(r["rewrites"]) + len(r["fission"]) + len(r["recipes"])
    assert not any(c.startswith("undo: ") or "no longer applies" in c for c in contents)
    assert f"{len(contents)} changes" in repr(plan)


def test_an_infeasible_limit_raises_with_the_best_plan(mlp) -> None:
    model, batch = mlp
    with pytest.raises(LimitNotMet, match="limit not met") as caught:
        peakcut.optimize(model, batch, mlp_loss, "sgd", memory_limit="1KB", time_budget=5, max_states=20)
    plan = caught.value.plan
    assert not plan.report["feasible"]
    assert plan.report["peak_bytes"] <= plan.report["eager_peak_bytes"]
    loss = plan.step(batch)
    assert torch.isfinite(loss)


def test_zero_budget_returns_at_once_and_tiny_budgets_are_honoured(mlp) -> None:
    model, batch = mlp
    g = peakcut.capture(model, batch, mlp_loss, "adamw")
    t0 = time.perf_counter()
    found = optimize_graph(g, time_budget=0)
    assert time.perf_counter() - t0 < 5
    assert found.result.states == 1 and found.report["search"]["stopped"] in ("time budget", "queue empty")
    assert found.report["peak_bytes"] == found.report["eager_peak_bytes"]
    t0 = time.perf_counter()
    optimize_graph(g, time_budget=0.5)
    assert time.perf_counter() - t0 < 0.5 + 1.0


def test_the_same_seed_gives_the_same_plan(mlp) -> None:
    model, batch = mlp
    g = peakcut.capture(model, batch, mlp_loss, "adamw")
    runs = [optimize_graph(g, memory_limit=0.6, time_budget=60, max_states=25, seed=7) for _ in range(2)]
    assert [r.report["search"]["stopped"] for r in runs] == ["max states", "max states"]
    assert runs[0].best.digest == runs[1].best.digest
    assert runs[0].report["applied"] == runs[1].report["applied"]


def test_a_saved_plan_reloads_and_runs(mlp, tmp_path) -> None:
    model, batch = mlp
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    plan = peakcut.optimize(a, batch, mlp_loss, "adamw", latency_limit=1.5, time_budget=5, max_states=15)
    saved = plan.save(tmp_path / "plan")
    assert sorted(p.name for p in saved.iterdir()) == ["graph.json", "order.json", "program.py", "report.json"]
    loaded = peakcut.load_plan(saved, b)
    for _ in range(2):
        assert torch.equal(plan.step(batch), loaded.step(batch))
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    with pytest.raises(FileNotFoundError, match="not a saved plan"):
        peakcut.load_plan(tmp_path, model)


def test_inference_is_optimized_too(mlp) -> None:
    model, batch = mlp
    x = batch[0]
    plan = peakcut.optimize(model, (x,), None, None, latency_limit=1.2, time_budget=5, max_states=15)
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(plan.step((x,)), expected)


def test_bad_arguments_are_named(mlp) -> None:
    model, batch = mlp
    with pytest.raises(ValueError, match="not both"):
        peakcut.optimize(model, batch, mlp_loss, memory_limit=0.5, latency_limit=1.1)
    with pytest.raises(ValueError, match="memory_limit"):
        peakcut.optimize(model, batch, mlp_loss, memory_limit="lots")
    with pytest.raises(ValueError, match="loss_fn"):
        peakcut.optimize(model, batch, None, "adamw")
    with pytest.raises(ValueError, match="unknown cost model"):
        peakcut.optimize(model, batch, mlp_loss, device="tpu-v9")


def test_the_computation_hash_ignores_ids_and_order_but_sees_rewrites(mlp) -> None:
    model, batch = mlp
    g = peakcut.capture(model, batch, mlp_loss, "adamw")
    again = peakcut.capture(model, batch, mlp_loss, "adamw")
    assert computation_hash(g) == computation_hash(again)
    # the AdamW step peaks inside the update (no activation alive); the gradient step does not
    g = peakcut.capture(model, batch, mlp_loss, None)
    c = RULES.hotspot_candidates(g, g.order, kinds=("remat",))[0]
    rw = c.apply(g, g.order)
    assert computation_hash(rw.graph, rw.order) != computation_hash(g)
