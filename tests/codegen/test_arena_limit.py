"""A memory limit with the arena bounds what the step needs: held + arena + unplanned remainder.

On each of the seven paper workloads at tiny size (SGD; analytic CPU profile, a few states), a plan
searched with arena=True under a memory limit between what the step holds and eager's peak
either meets the limit by that figure (held + arena + the unplanned remainder's peak,
report["arena"]["needed_bytes"]) or says it does not (feasible False): never a plan that
claims the limit and needs more. The figure is the one the program's Step builds, and
peakcut.optimize(..., arena=True) runs the arena it priced.
"""

from __future__ import annotations

import pytest

import peakcut
from peakcut.codegen.program import Step
from peakcut.optimizer.api import optimize_graph
from peakcut.workloads import WORKLOAD_NAMES, get_workload
from tests.codegen.test_arena import gpt

SEARCH = {"device": "cpu", "max_states": 4, "time_budget": 4.0, "reorder": False, "workspace": None}


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_memory_limit_with_the_arena_holds_for_arena_plus_unplanned(name):
    inst = get_workload(name).build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "sgd")
    found = optimize_graph(g, memory_limit=0.9, arena=True, **SEARCH)
    report, limit = found.report, found.objective.limit
    needed = report["arena"]["needed_bytes"]
    assert report["feasible"] == found.feasible == (needed <= limit), (needed, limit)
    assert needed == (report["arena"]["held_bytes"] + report["arena"]["arena_bytes"]
                      + report["arena"]["unplanned_peak_bytes"])
    best = found.best                       # the plan's step runs the arena the search priced
    step = Step(best.program, list(best.order), arena=found.arena)
    assert step.arena_plan is not None and step.arena_plan.needed_bytes == needed
    assert step.arena_plan.placed == found.arena.placed and "# placed in the arena" in step.source


def test_optimize_with_the_arena_runs_the_arena_it_priced():
    model, batch, loss_fn = gpt()
    plan = peakcut.optimize(model, batch, loss_fn, "sgd", memory_limit=0.9, device="cpu", time_budget=30,
                            max_states=4, arena=True)
    entry = plan.report["arena"]
    assert plan.report["feasible"] and entry["needed_bytes"] <= plan.report["limit"]
    step = plan.program
    assert step.arena_plan is not None and step.arena_plan.needed_bytes == entry["needed_bytes"]
    assert float(plan.step(batch)) > 0 and step.arena is not None
    with pytest.raises(ValueError, match="arena="):
        peakcut.optimize(model, batch, loss_fn, "sgd", arena="yes")
