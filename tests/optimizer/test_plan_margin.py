"""optimize_graph(plan_margin=m) under a latency limit: the search plans to limit x (1 - m);
the limit reported, judged and verified is the user's (peakcut.optimize passes PLAN_MARGIN
where verification follows)."""

from __future__ import annotations

import pytest

import peakcut
from peakcut.optimizer import optimize_graph
from peakcut.workloads import get_workload


@pytest.fixture(scope="module")
def unet() -> peakcut.Graph:
    inst = get_workload("unet").build("tiny")
    return peakcut.capture(inst.model, inst.batch, inst.loss_fn, peakcut.AdamW())


def test_the_search_plans_below_the_limit_by_the_margin(unet: peakcut.Graph) -> None:
    plain = optimize_graph(unet, device="h200", latency_limit=1.1, time_budget=5, max_states=40)
    kept = optimize_graph(unet, device="h200", latency_limit=1.1, time_budget=5, max_states=40, plan_margin=0.05)
    assert kept.report["limit"] == plain.report["limit"]            # the user's limit
    assert kept.report["search"]["plan_margin"] == 0.05 and plain.report["search"]["plan_margin"] == 0.0
    assert kept.best.latency_s <= 0.95 * kept.report["limit"] * (1 + 1e-9)
    assert kept.report["feasible"]


def test_no_margin_under_a_memory_limit(unet: peakcut.Graph) -> None:
    found = optimize_graph(unet, device="h200", memory_limit=0.8, time_budget=5, max_states=20, plan_margin=0.05)
    assert found.report["search"]["plan_margin"] == 0.0
