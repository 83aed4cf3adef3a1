"""The calibrated CPU workspace model: measured on the running machine, cached per fingerprint.

Every check compares against what this machine's allocator does, so it holds on any CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import peakcut
from peakcut.memory import simulate
from peakcut.memory.workspace import (
    CalibratedCpuWorkspace,
    CpuMachine,
    CpuWorkspace,
    describe_workspace,
    measure_calls,
    order_workspace,
    workspace_model,
)
from peakcut.optimizer.api import optimize_graph
from peakcut.runtime.measure import profiler_peak
from tests.helpers import cross_entropy_loss

aten = torch.ops.aten


def _model(tmp_path: Path, max_call_bytes: int = 64 << 20) -> CalibratedCpuWorkspace:
    """A fresh model (not the process-wide instance) with its cache file under tmp_path."""
    fingerprint = CalibratedCpuWorkspace.for_this_machine(tmp_path).fingerprint
    return CalibratedCpuWorkspace(CpuMachine.current(), fingerprint, tmp_path / "ws.json", max_call_bytes)


def _graph(small_cnn: tuple) -> peakcut.ir.Graph:
    model, batch = small_cnn
    return peakcut.capture(model, batch, cross_entropy_loss, "adamw")


def test_measure_calls_is_the_allocator_peak_beyond_what_the_call_returns() -> None:
    x, w = torch.rand(2, 8, 16, 16), torch.rand(8, 8, 3, 3)
    conv = lambda: aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)  # noqa: E731
    conv()
    peak, out = profiler_peak(conv)
    held = out.untyped_storage().nbytes()
    a = torch.ones(4, 4)
    mm = lambda: aten.mm.default(a, a)  # noqa: E731
    assert measure_calls([conv, mm]) == [peak - held, 0]


def test_a_graph_is_measured_once_and_the_next_process_reads_the_file(small_cnn: tuple, tmp_path: Path) -> None:
    g = _graph(small_cnn)
    first = _model(tmp_path)
    ws = order_workspace(g, g.order, first)
    entries = first.entries()
    assert entries and all(e.measured for e in entries.values())
    assert ws.max() > 0                       # the convolutions take scratch on every CPU
    saved = json.loads((tmp_path / "ws.json").read_text())
    assert saved["fingerprint"] == first.fingerprint.as_dict()
    second = _model(tmp_path)                 # a new process: the table comes from the file
    assert second.entries() == entries
    g2 = _graph(small_cnn)
    assert (order_workspace(g2, g2.order, second) == ws).all()
    assert second.entries() == entries        # nothing measured again


def test_simulated_peak_equals_the_measured_one(small_cnn: tuple) -> None:
    model, batch = small_cnn
    g = _graph(small_cnn)
    measured = peakcut.measure(peakcut.build(g), model, batch, repeats=1).peak_bytes
    assert simulate(g, workspace="cpu").peak_bytes == measured


def test_big_calls_and_failing_calls_are_answered_by_the_rules(small_cnn: tuple, tmp_path: Path) -> None:
    g = _graph(small_cnn)
    model = _model(tmp_path, max_call_bytes=1024)
    ws = order_workspace(g, g.order, model)
    rules = order_workspace(g, g.order, CpuWorkspace(CpuMachine.current()))
    big = [e for e in model.entries().values() if not e.measured]
    assert big and all("exceed max_call_bytes" in e.reason for e in big)
    saved = json.loads((tmp_path / "ws.json").read_text())["entries"]
    assert saved and all(e["measured"] for e in saved.values())      # the rules' answers stay in memory
    assert len(saved) == len(model.entries()) - len(big)
    for i, nid in enumerate(g.order):                       # the rules' value where they answered
        key = peakcut.cost.calls.call_key(g, nid)
        entry = model.entries().get(key)
        if entry is not None and not entry.measured:
            assert ws[i] == rules[i]


def test_a_running_profiler_is_left_alone_and_the_rules_answer(small_cnn: tuple, tmp_path: Path) -> None:
    g = _graph(small_cnn)
    model = _model(tmp_path)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ws = order_workspace(g, g.order, model)
        torch.ones(3).sum()
    assert any(e.name == "aten::ones" for e in prof.events())    # the caller's session still recorded
    assert model.entries() == {}
    assert (ws == order_workspace(g, g.order, CpuWorkspace(CpuMachine.current()))).all()


def test_a_bad_cache_file_is_named_and_rebuilt(tmp_path: Path) -> None:
    (tmp_path / "ws.json").write_text("{not json")
    with pytest.warns(RuntimeWarning, match="workspace cache .*ws.json.*not valid JSON"):
        model = _model(tmp_path)
    assert model.entries() == {}


def test_specs_and_descriptions(small_cnn: tuple) -> None:
    assert isinstance(workspace_model("cpu"), CalibratedCpuWorkspace)
    assert workspace_model("cpu") is workspace_model("cpu")      # one table per process
    assert isinstance(workspace_model("cpu-rules"), CpuWorkspace)
    assert workspace_model(None) is None
    with pytest.raises(ValueError, match="unknown workspace model 'gpu'"):
        workspace_model("gpu")
    assert "calibrated on this machine" in describe_workspace("cpu")
    assert "rules" in describe_workspace("cpu-rules")
    found = optimize_graph(_graph(small_cnn), time_budget=0.5, device="cpu", max_states=5)
    assert "calibrated on this machine" in found.report["memory_method"]


def test_a_one_thread_worker_leaves_the_rules_to_answer(small_cnn: tuple, tmp_path: Path) -> None:
    g = _graph(small_cnn)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        parent = _model(tmp_path)                    # made with 2 threads, as a parent makes it
        torch.set_num_threads(1)                     # what a forked search worker does
        in_worker = order_workspace(g, g.order, parent)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    assert parent.entries() == {}                    # nothing measured on the wrong threads
    assert (in_worker == order_workspace(g, g.order, CpuWorkspace(parent.machine))).all()


def test_two_processes_writing_one_file_keep_both_tables(small_cnn: tuple, tmp_path: Path) -> None:
    g = _graph(small_cnn)
    first, second = _model(tmp_path), _model(tmp_path)      # both loaded the empty file
    order_workspace(g, g.order[: len(g.order) // 2], first)
    order_workspace(g, g.order[len(g.order) // 2:], second)
    assert _model(tmp_path).entries() == {**first.entries(), **second.entries()}
