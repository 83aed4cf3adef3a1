"""The generated program reads like a program: its step takes four named mappings and a few
keywords, alike fission parts run as a loop even where the order runs ops outside the region
between them, and the file opens with a table of contents. Numbers and the measured peak stay
those of the order."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from typing import NamedTuple

import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.codegen.source import generate_source
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.tags import FissionTag
from peakcut.memory import simulate
from peakcut.rules import RULES
from tests.conftest import SmallCNN, cnn_loss
from tests.fission.test_expand import SPEC, Case, mlp_loss


class _Site(NamedTuple):
    tensor: int
    node: int
    users: tuple[int, ...]


def _late(g: Graph, order: Sequence[int]) -> list[int]:
    """`order` with each load, detach and transpose outside every region moved right before its
    first reader (what a schedule hiding the loads does): into the region's stretch."""
    out = list(order)
    movable = [n for n in out if g.nodes[n].op in ("peakcut.load.default", "aten.detach.default", "aten.t.default")
               and g.nodes[n].tags.get(FissionTag) is None]
    for nid in reversed(movable):
        out.remove(nid)
        after = g.successors(nid)
        out.insert(min(i for i, m in enumerate(out) if m in after), nid)
    return out


def _forward_in_parts_with_parameters_in_host_memory() -> tuple[Case, Graph, list[int]]:
    case = Case()
    ex = case.expand(case.fnode(0, case.nodes(Phase.FORWARD, Phase.LOSS, views=False), 2))
    g, order = ex.graph, list(ex.order)
    rule = RULES.program_rule("offload_param")
    for name in ("param:fc2.weight", "param:fc3.weight"):
        rw = rule.apply(g, order, _Site(g.inputs[g.input_names.index(name)], -1, ()))
        g, order = rw.graph, list(rw.order)
    return case, g, _late(g, order)


def test_alike_parts_run_as_a_loop_with_the_ops_outside_the_region_where_they_run() -> None:
    case, g, order = _forward_in_parts_with_parameters_in_host_memory()
    source = generate_source(g, order)
    assert source.count("for part in range(2):") == 1 and "emitted unrolled" not in source
    assert "if part == 0:  # outside the region, run in part 0" in source
    assert "lives in host memory: copy it in" in source.split("for part in range(2):")[1].split("return")[0]
    report = peakcut.check_equivalence(case.model, case.batch, mlp_loss, SPEC, lambda _m: Step(g, order),
                                       steps=2, rtol=1e-5, atol=1e-6)
    assert report.ok, str(report)
    measured = peakcut.measure(Step(g, order), case.model, case.batch, method="cpu-profiler", repeats=1)
    assert measured.peak_bytes == simulate(g, order).peak_bytes


def test_the_step_takes_named_mappings_and_at_most_eight_parameters() -> None:
    torch.manual_seed(0)
    g = peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))), cnn_loss, "adamw")
    order = g.order
    for kind in ("swap", "host_update"):      # the most keywords: hp, host, host_ops
        (c,) = RULES.hotspot_candidates(g, order, limit=1, kinds=(kind,))
        rw = c.apply(g, order)
        g, order = rw.graph, rw.order
    step = Step(g, order)
    params = inspect.signature(step._fn).parameters
    assert list(params) == ["params", "buffers", "state", "batch", "device", "hp", "host", "host_ops"]
    assert "p_conv_weight = params['conv.weight']" in step.source
    assert "batch_0 = batch[0]" in step.source


def test_the_program_opens_with_its_contents() -> None:
    _, g, order = _forward_in_parts_with_parameters_in_host_memory()
    head = generate_source(g, order).split('"""')[1]
    assert "Contents:" in head
    assert "- inputs: 6 in params, 12 in state, 2 in batch" in head
    assert "- phases: forward " in head and "optimizer" in head
    assert "- fission region 0: 2 parts along D-Graph dimension" in head and ", a loop" in head
    assert "- applied: 2 inputs kept in host memory between steps" in head
    assert "- ops by node tag: fission " in head


def test_on_cuda_the_copies_run_in_the_loop_record_their_events_before_the_waits() -> None:
    _, g, order = _forward_in_parts_with_parameters_in_host_memory()
    edit = GraphEditor(g)
    edit.set_device("cuda")
    source = generate_source(edit.finish(), order)
    compile(source, "<generated>", "exec")
    assert source.count("for part in range(2):") == 1 and "h2d.wait_stream(compute)" in source
    recorded: set[str] = set()
    waited = 0
    for line in source.splitlines():
        if m := re.match(r"^\s*(ev_\w+)\.record\(", line):
            recorded.add(m.group(1))
        if m := re.search(r"wait_event\((ev_\w+)\)", line):
            assert m.group(1) in recorded, line
            waited += 1
    assert waited > 0
