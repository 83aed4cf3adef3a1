"""The search on two processes (optimizer.parallel) and the compact-evaluated best it returns."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.cost import get_cost_model
from peakcut.memory.workspace import CalibratedCpuWorkspace, CpuMachine
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.derive import Deriver
from peakcut.optimizer.parallel import can_fork
from peakcut.workloads import get_workload
from tests.helpers import in_float64

SPEC = peakcut.SGD(lr=1e-2, momentum=0.9)
needs_fork = pytest.mark.skipif(not can_fork(), reason="no 'fork' start method on this platform")


@pytest.fixture(scope="module")
def bert():
    inst = in_float64(get_workload("bert-base").build("tiny"))
    return inst, peakcut.capture(inst.model, inst.batch, inst.loss_fn, SPEC, keep_grads=True)


@needs_fork
def test_two_processes_give_a_runnable_exact_plan_and_the_same_one_twice(bert) -> None:
    inst, g = bert
    runs = [optimize_graph(g, latency_limit=1.3, device="rtx3090", time_budget=60, max_states=24, jobs=2)
            for _ in range(2)]
    first, second = (r.report for r in runs)
    assert first["search"]["jobs"] == 2
    assert (first["peak_bytes"], first["latency_s"], first["applied"]) == (
        second["peak_bytes"], second["latency_s"], second["applied"])
    best = runs[0].best
    assert not best.compact
    assert first["peak_bytes"] <= first["eager_peak_bytes"]
    report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, SPEC,
                                       lambda _m: Step(best.program, best.order), steps=2,
                                       rtol=1e-7, atol=1e-9)
    assert report.ok, report


@needs_fork
def test_two_processes_keep_the_time_budget(bert) -> None:
    _, g = bert
    t0 = time.perf_counter()
    found = optimize_graph(g, memory_limit=0.3, device="h200", time_budget=6, jobs=2)
    assert time.perf_counter() - t0 < 6 + 1.0
    assert found.report["search"]["states"] >= 2
    assert all(p["exact"] in (True, False) for p in found.report["front"])


def test_bad_jobs_are_refused_with_the_reason(bert) -> None:
    _, g = bert
    with pytest.raises(ValueError, match="jobs=0"):
        optimize_graph(g, latency_limit=1.1, time_budget=1, jobs=0)
    with pytest.raises(ValueError, match="measured cost model"):
        optimize_graph(g, latency_limit=1.1, time_budget=1, device="measured", jobs=2)


@needs_fork
def test_the_pareto_front_of_two_processes_is_exact(bert) -> None:
    _, g = bert
    found = optimize_graph(g, pareto=True, device="rtx3090", time_budget=8, jobs=2)
    front = found.report["front"]
    assert front and all(p["exact"] for p in front)
    peaks = [p["peak_bytes"] for p in front]
    assert peaks == sorted(peaks)


def test_workers_model_the_parents_machine() -> None:
    """A worker runs torch on one thread; the deriver it inherits resolved its workspace model
    when the parent made it (threads included), so both model the machine the plan runs on."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        pinned = Deriver(get_cost_model("rtx3090"))        # made in the parent
        torch.set_num_threads(1)              # what a worker does first
        assert isinstance(pinned.workspace, CalibratedCpuWorkspace)
        assert pinned.workspace.machine == replace(CpuMachine.current(), threads=3)
        assert "3 threads" in pinned.workspace.fingerprint.device
        assert Deriver(get_cost_model("rtx3090"), workspace=None).workspace is None
    finally:
        torch.set_num_threads(before)


@needs_fork
def test_an_isolated_search_finds_what_the_search_here_finds(bert) -> None:
    """optimize runs an analytic search in a forked process (the caller keeps none of its
    memory); with a fixed number of states it finds the plan the search in this process does."""
    _, g = bert
    here, isolated = (optimize_graph(g, memory_limit=0.5, device="h100", time_budget=60, max_states=3, isolate=i)
                      for i in (False, True))
    assert (here.report["peak_bytes"], here.report["latency_s"], here.report["applied"]) == (
        isolated.report["peak_bytes"], isolated.report["latency_s"], isolated.report["applied"])
    assert isolated.result.bests and not isolated.best.compact


def test_a_measuring_search_is_not_isolated() -> None:
    from peakcut.optimizer.parallel import isolated

    assert not isolated(measures=True)


class _RefusedHere(ValueError):
    """An error of the search itself (module level, so that it pickles)."""


def _failing_search(*_args, **_kwargs):
    raise _RefusedHere("node 12 (aten.mm): a rule refused it")


@needs_fork
def test_a_forked_search_raises_the_error_the_search_raised(monkeypatch) -> None:
    """The caller sees the search's own exception, type and message, with the worker's
    traceback as its cause, as if the search had run in this process."""
    from peakcut.optimizer import parallel

    monkeypatch.setattr(parallel, "search", _failing_search)
    with pytest.raises(_RefusedHere, match="node 12") as caught:
        parallel.parallel_search(None, None, None, jobs=1, isolate=True)
    assert isinstance(caught.value.__cause__, parallel.SearchWorkerError)
    assert "_failing_search" in str(caught.value.__cause__)


def test_a_worker_error_that_does_not_pickle_keeps_its_traceback() -> None:
    from peakcut.optimizer.parallel import SearchWorkerError, worker_error

    err = worker_error(3, None, "Traceback ...\nKeyError: 'x'")
    assert isinstance(err, SearchWorkerError) and "worker 3" in str(err) and "KeyError" in str(err)
