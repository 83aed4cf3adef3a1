"""bench.peers: row set, failed cells, and the paper-size captures on tiny models (fast)."""

from __future__ import annotations

import pytest

from bench.peers.__main__ import parse_args, tool_list
from bench.peers.report import summary_table
from bench.peers.results import Cell
from bench.peers.simulate import JointCapture, capture_checkpointed, evaluate
from bench.peers.tools import Tool
from peakcut.workloads import get_workload


def test_default_rows() -> None:
    names = [t.name for t in tool_list(parse_args([]))]
    assert names[:2] == ["eager", "checkpoint per block"]
    assert names[-2:] == ["peakcut memory <= 50%", "peakcut latency <= 1.10x"]
    # aot_eager: budgets 1.0 and 0.0 once, 4 knapsack budgets x 3 solvers; inductor: 3 budgets, dp
    assert sum("aot_eager" in n for n in names) == 2 + 4 * 3
    assert sum("inductor" in n for n in names) == 3


def test_failed_cell_says_why() -> None:
    eager = Cell("w", "eager", "eager", "tiny", peak_bytes=2**20, times=[0.01])
    bad = Cell("w", "x", "x", "tiny", error="RuntimeError: boom")
    table = summary_table([eager, bad], "tiny", ["w"], ["eager", "x"])
    assert "failed: RuntimeError: boom" in table


@pytest.mark.parametrize("workload", ["btlm-3b", "resnet50"])
def test_checkpoint_capture_recomputes(workload: str) -> None:
    inst = get_workload(workload).build("tiny")
    import peakcut

    eager = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    g, _ = capture_checkpointed(inst)
    assert len(g.nodes) > len(eager.nodes)  # the recomputed forward ops


def test_budget_zero_partition_is_captured() -> None:
    inst = get_workload("gpt-neo-1.3b").build("tiny")
    tools = [Tool("compile", "aot_eager", b) for b in (1.0, 0.4)]
    jc = JointCapture(inst, tools)
    full, low = (evaluate(Cell(inst.name, t.name, t.curve, "tiny"), jc.graph(t)) for t in tools)
    assert low.peak_bytes < full.peak_bytes and low.nodes > full.nodes
