"""Work that must grow linearly with the step, counted instead of timed.

Steps of 20k+ ops (issue 17: LLMs at full size) made a few passes quadratic: a scan of the
whole order for every hoisting block (schedule.moves.hoist_blocks), a test of every
boundary output against every copied node of a fission region (RegionExpander.region), a
Python pass over every node of every scored dominator subtree (analyzer.compute_scores).
Each test here counts the Python lines those functions (and the comprehensions inside
them) execute on a model of d and of 3d layers; quadratic work triples the count per op.
Line counts do not depend on the machine or its load.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterable
from types import CodeType, SimpleNamespace
from typing import Any

import pytest
import torch

import peakcut
from peakcut.fission import analyzer, build
from peakcut.fission.dgraph import build_dgraph
from peakcut.fission.expand import expand
from peakcut.fission.loss import detach_loss
from peakcut.fission.region import RegionExpander
from peakcut.ir.graph import Graph
from peakcut.schedule.moves import hoist_blocks
from peakcut.workloads import btlm


def _codes(functions: Iterable[Callable[..., Any]]) -> set[CodeType]:
    """The code objects of the functions and of every comprehension or closure inside them."""
    found: set[CodeType] = set()
    todo = [f.__code__ for f in functions]
    while todo:
        code = todo.pop()
        found.add(code)
        todo.extend(c for c in code.co_consts if isinstance(c, CodeType))
    return found


def lines_run(functions: Iterable[Callable[..., Any]], call: Callable[..., Any], *args: Any,
              **kwargs: Any) -> tuple[Any, int]:
    """call(*args, **kwargs)'s result and the number of lines the functions' own code ran meanwhile."""
    codes = _codes(functions)
    count = 0

    def local(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def start(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code in codes else None

    before = sys.gettrace()
    sys.settrace(start)
    try:
        out = call(*args, **kwargs)
    finally:
        sys.settrace(before)
    return out, count


def _pairs(n: int) -> tuple[SimpleNamespace, SimpleNamespace]:
    """A problem of n nodes in pairs (2k+1 reads 2k) and its reachability, for hoist_blocks."""
    anc = {v: (1 << (v - 1)) if v % 2 else 0 for v in range(n)}
    des = {v: 0 if v % 2 else 1 << (v + 1) for v in range(n)}
    return SimpleNamespace(n=n), SimpleNamespace(anc=anc, des=des)


def test_a_hoisting_block_costs_its_members_not_the_order() -> None:
    per_block = []
    for n in (400, 1200):
        problem, reach = _pairs(n)
        blocks, lines = lines_run([hoist_blocks], lambda *a: list(hoist_blocks(*a)), problem, list(range(n)), reach, 0)
        assert blocks == [[v - 1, v] if v % 2 else [v] for v in range(2, n)]   # node 1 depends on the peak node 0
        per_block.append(lines / len(blocks))
    assert per_block[1] < 1.05 * per_block[0]


@pytest.fixture(scope="module")
def steps() -> list[Graph]:
    """BTLM tiny (AdamW step, loss detached) with 2 and 6 layers."""
    graphs = []
    for layers in (2, 6):
        torch.manual_seed(0)
        cfg = dataclasses.replace(btlm.TINY, n_layer=layers)
        ids = torch.randint(0, cfg.vocab_size, (4, 16))
        batch = (ids, torch.ones(4, 16, dtype=torch.long), ids.clone())
        graphs.append(detach_loss(peakcut.capture(btlm.BTLMForCausalLM(cfg), batch, btlm.btlm_loss, "adamw")))
    return graphs


def test_expanding_a_region_is_linear_in_its_nodes(steps: list[Graph]) -> None:
    per_node = []
    for g in steps:
        tree, dgraph = build.find_ftree(g, batch_only=True)
        root = max(tree.roots(), key=lambda f: len(tree.nodes[f].nodes))
        _, lines = lines_run([RegionExpander.region], expand, g, g.order, tree.with_n(root, 2), dgraph, check=False)
        per_node.append(lines / len(tree.nodes[root].nodes))
    assert per_node[1] < 1.2 * per_node[0], per_node


def test_scoring_dominator_subtrees_is_linear_in_the_component(steps: list[Graph]) -> None:
    per_node = []
    for g in steps:
        dgraph = build_dgraph(g)
        comp, sources = build.batch_components(g, dgraph)[0]
        view = build.component_view(g, comp, sources)
        mem = build.memory_view(g)
        scores, lines = lines_run([analyzer.compute_scores, analyzer._Reads.__init__, analyzer._Reads.input_bytes],
                                  analyzer.compute_scores, view, mem)
        assert scores.score
        per_node.append(lines / len(view.nodes))
    assert per_node[1] < 1.2 * per_node[0], per_node
