"""A measured search inside its time budget (peakcut.optimizer.budget, .reprice, .phases): calls
not measured yet are priced at once and measured in slices, which fill the cost cache; a
cold-cache optimize reports where its time went and gives the search its share."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path

import pytest
import torch
from torch import nn

import peakcut
from peakcut.cost import MeasuredCostModel, TimingSettings
from peakcut.cost.calls import call_key
from peakcut.optimizer import api, optimize_graph, shares
from peakcut.optimizer.arena import layout_seconds
from peakcut.optimizer.budget import BudgetedCost, MeasurePacer
from peakcut.optimizer.parallel import can_fork
from peakcut.optimizer.phases import ORDER, phases_line
from tests.cost.graphs import NODE, add_graph, mm_graph

FAST = TimingSettings(warmup=1, repeats=3, min_loop_seconds=2e-5, retries=0, rounds=3)


def _measured(tmp_path: Path) -> MeasuredCostModel:
    return MeasuredCostModel("cpu", cache_dir=tmp_path, settings=FAST, line_overhead=False)


def test_an_unknown_call_is_priced_at_once_and_measured_later_into_the_cache(tmp_path: Path) -> None:
    measured = _measured(tmp_path)
    measured.node_seconds(mm_graph(32, 32, 32), NODE)            # one point of the family
    cost = BudgetedCost(measured, deadline=time.perf_counter() + 60)
    g = mm_graph(64, 64, 64)
    before = measured.measurements
    price = cost.node_seconds(g, NODE)
    assert price > 0 and measured.measurements == before and cost.fitted == 1
    assert cost.node_seconds(g, NODE) == price                   # the same price until measured
    assert cost.measure_some(10.0) == 1
    assert cost.fitted == 0 and cost.measured_keys == 1
    assert call_key(g, NODE) in json.loads(measured.cache_path.read_text())["entries"]
    assert cost.node_seconds(g, NODE) == measured.node_seconds(g, NODE)


def test_nothing_is_measured_past_the_deadline(tmp_path: Path) -> None:
    cost = BudgetedCost(_measured(tmp_path), deadline=time.perf_counter() - 1)
    cost.node_seconds(add_graph(4096), NODE)
    assert cost.measure_some(10.0) == 0 and cost.fitted == 1


def test_the_pacer_measures_only_its_share_of_the_time(tmp_path: Path) -> None:
    cost = BudgetedCost(_measured(tmp_path), deadline=time.perf_counter() + 60)
    cost.node_seconds(add_graph(4096), NODE)
    pacer = MeasurePacer(cost, duty=0.1)
    pacer.tick()                       # no time has passed: no slice
    assert cost.fitted == 1 and pacer.spent == 0
    pacer.t0 -= 100.0                  # as if the search had run 100 s
    pacer.tick()
    assert cost.fitted == 0 and pacer.spent > 0


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def test_a_cold_cache_optimize_reports_its_phases_and_searches_its_share(tmp_path: Path, monkeypatch) -> None:
    """From an empty cache: the report says the seconds and states of every phase, the search
    is given at least SEARCH_SHARE of the budget (or all that capture and calibration left:
    verification asks for no more than its share with no time needed for its rounds, so that
    a busy machine's slow eager steps do not decide), and every call measured, before the search or
    beside it, is in the cache file with the work its fit reads."""
    monkeypatch.setenv("PEAKCUT_CACHE", str(tmp_path))
    monkeypatch.setattr(shares, "VERIFY_MARGIN", 0.0)
    monkeypatch.setattr(api, "verify_seconds", lambda *args, **kwargs: 0.0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))
    batch = (torch.randn(32, 64), torch.randint(0, 10, (32,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    budget = 12.0
    try:
        plan = peakcut.optimize(model, batch, _loss, opt, device="measured:cpu", latency_limit=1.1,
                                time_budget=budget)
    except peakcut.LimitNotMet as e:          # (a busy machine's noise; the phases are still reported)
        plan = e.plan
    phases = plan.report["phases"]
    seconds = phases["seconds"]
    assert {"capture", "calibration", "search", "verification"} <= set(seconds) <= set(ORDER)
    assert sum(seconds.values()) <= phases["total_s"] + 1e-3
    assert phases["states"]["search"] == plan.report["search"]["states"] >= 1
    before = seconds["capture"] + seconds["calibration"]     # (long on a busy machine)
    assert plan.report["search"]["time_budget_s"] + 0.5 >= min(shares.SEARCH_SHARE * budget, budget - before)
    assert "search" in phases_line(phases)
    entries = json.loads(next((tmp_path / "costs").glob("cpu-*.json")).read_text())["entries"]
    with_work = sum("work" in e for e in entries.values())      # every measured call, with its work
    assert with_work > 0
    repriced = plan.report.get("repriced")     # (none where a busy machine's calibration left no search)
    assert repriced is None or repriced["fit_points"] <= with_work


def test_a_job_as_plain_data_pickles_and_times_the_same_call(tmp_path: Path) -> None:
    """A forked search sends its calls to the caller as JobSpecs: they pickle, and the job
    rebuilt from one has the key and runs the call of the node it came from."""
    measured = _measured(tmp_path)
    g = mm_graph(16, 24, 8)
    job = measured.job(g, NODE)
    spec = pickle.loads(pickle.dumps(measured.spec_of(job)))
    again = measured.job_from(spec)
    assert (again.key, again.nbytes, again.estimate()) == (job.key, job.nbytes, job.estimate())
    assert torch.equal(again.build()(), job.build()())
    copy = measured.job_from(pickle.loads(pickle.dumps(measured.spec_of(measured.copy_job(4096, "d2h")))))
    assert copy.key == measured.copy_job(4096, "d2h").key and copy.build()().numel() == 4096


@pytest.mark.skipif(not can_fork(), reason="no 'fork' start method on this platform")
def test_a_forked_measured_search_has_the_caller_measure_its_calls(tmp_path: Path, monkeypatch) -> None:
    """optimize_graph runs a measured search in a forked process too (the caller keeps none
    of its memory). The fork times nothing itself (OpenMP threads do not survive a fork): its
    pacer's slices are measured by the caller, into the caller's table and cache file, and
    the counts come back for the report."""
    answered: list[int] = []
    answer = BudgetedCost.answer

    def counted(self: BudgetedCost, specs: list, until: float) -> dict:
        answered.append(len(specs))          # (appended in the caller only: the fork only asks)
        return answer(self, specs, until)

    monkeypatch.setattr(BudgetedCost, "answer", counted)
    # fork here even where earlier tests left a thread in this process (a progress bar's
    # monitor, say), which optimize_graph's check refuses to fork beside: the fork is what is tested
    monkeypatch.setattr(api, "isolated", lambda measures: can_fork() and not measures)
    # a pacer whose first tick has a slice to spend: as if the search had run 100 s
    monkeypatch.setattr(api, "MeasurePacer",
                        lambda cost, until: MeasurePacer(cost, duty=1.0, until=until, t0=time.perf_counter() - 100))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))
    batch = (torch.randn(32, 64), torch.randint(0, 10, (32,)))
    g = peakcut.capture(model, batch, _loss, torch.optim.SGD(model.parameters(), lr=1e-2))
    measured = _measured(tmp_path)
    found = optimize_graph(g, latency_limit=1.1, device=measured, time_budget=20, max_states=8, isolate=True)
    assert sum(answered) > 0
    cost = found.cost
    assert isinstance(cost, BudgetedCost) and cost.measured_keys >= sum(answered) > 0
    assert found.report["phases"]["measuring_in_search_s"] > 0
    assert found.report["repriced"]["measured_since"] == cost.measured_keys
    on_disk = json.loads(measured.cache_path.read_text())["entries"]
    assert all(measured.has(k) for k in on_disk) and len(on_disk) >= cost.measured_keys


@pytest.mark.parametrize("search_s", [5.0, 45.0, 400.0])
def test_the_graph_budget_leaves_the_search_its_seconds(search_s: float) -> None:
    """optimize_graph keeps its reprice's share and its layout's seconds after the search (the
    layout's at its share or at its cap): what is left of graph_budget(s) is s."""
    budget = api.graph_budget(search_s)
    kept = shares.REPRICE_SHARE * budget + layout_seconds(budget)
    assert budget - kept == pytest.approx(search_s)
