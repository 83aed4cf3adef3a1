"""Where the collectives of an FSDP2 step run (ir.collectives.overlapped_order), and the regather
move as the search makes it: before the search, and composed with checkpointed blocks.

The step is bench.distributed's tiny Llama, captured in this process over torch's fake process
group of 4 ranks (no other process starts)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("transformers")

from bench.distributed import capture_step  # noqa: E402
from peakcut.cost import get_cost_model  # noqa: E402
from peakcut.ir.collectives import ALL_GATHER_OP, REDUCE_SCATTER_OP, WAIT_OP, overlapped_order  # noqa: E402
from peakcut.ir.graph import Graph  # noqa: E402
from peakcut.ir.node import Phase  # noqa: E402
from peakcut.ir.registry import OpKind, lookup  # noqa: E402
from peakcut.memory.workspace import workspace_model  # noqa: E402
from peakcut.optimizer import optimize_graph  # noqa: E402
from peakcut.optimizer.api import _root  # noqa: E402
from peakcut.optimizer.children import MoveSettings, children  # noqa: E402
from peakcut.optimizer.derive import Deriver  # noqa: E402
from peakcut.optimizer.objective import Objective  # noqa: E402
from peakcut.optimizer.root_rewrites import with_root_rewrites  # noqa: E402
from peakcut.transform.regather import RegatherTag  # noqa: E402


@pytest.fixture(scope="module")
def step() -> Graph:
    g, _ = capture_step("tiny", 4, 2, 32)
    return g


def _is_view(g: Graph, nid: int) -> bool:
    info = lookup(g.nodes[nid].op)
    return info is not None and info.kind is OpKind.VIEW


def _readers(g: Graph, gather: int) -> list[int]:
    """The nodes that read all-gather `gather`'s data (past its wait and views)."""
    seen, todo, found = set(), [g.nodes[gather].outputs[0]], []
    while todo:
        for u in g.users(todo.pop()):
            if u in seen:
                continue
            seen.add(u)
            if g.nodes[u].op == WAIT_OP or _is_view(g, u):
                todo.extend(g.nodes[u].output_tuple)
            else:
                found.append(u)
    return found


def _first_reader(g: Graph, gather: int, at: dict[int, int]) -> int:
    """The position of the first node that reads gather's data."""
    return min(at[u] for u in _readers(g, gather))


def test_reduce_scatters_start_when_their_gradient_is_made(step: Graph) -> None:
    order = overlapped_order(step, step.order)
    at = {n: i for i, n in enumerate(order)}
    scatters = [n for n in order if step.nodes[n].op == REDUCE_SCATTER_OP]
    assert scatters
    for rs in scatters:
        made, todo = -1, list(step.predecessors(rs))
        while todo:                       # the nodes that make the gradient (through its views)
            p = todo.pop()
            if _is_view(step, p):
                todo.extend(step.predecessors(p))
            else:
                made = max(made, at[p])
        between = order[made + 1:at[rs]]
        # nothing that computes runs between the gradient and its reduce-scatter
        assert all(_is_view(step, n) or step.nodes[n].op in (WAIT_OP, ALL_GATHER_OP, REDUCE_SCATTER_OP)
                   for n in between), [step.nodes[n].op for n in between]


def test_gathers_run_ahead_of_their_readers_within_the_window(step: Graph) -> None:
    order = overlapped_order(step, step.order)
    at = {n: i for i, n in enumerate(order)}
    gathers = [n for n in order if step.nodes[n].op == ALL_GATHER_OP]
    size = {n: step.tensors[step.nodes[n].outputs[0]].nbytes for n in gathers}
    window = 2 * max(size.values())
    read = {n: _first_reader(step, n, at) for n in gathers}
    for n in gathers:
        assert at[n] < read[n]
        ahead = sum(size[m] for m in gathers if at[m] <= at[n] < read[m])
        assert ahead <= window
    # issued ahead, not all at the start: the last gather read is issued after the first is read
    first, last = min(gathers, key=read.get), max(gathers, key=read.get)
    assert at[last] > read[first]


def _forward_gathers_read_in_backward(g: Graph) -> list[str]:
    """The forward's gathers (not a regather's) whose data a backward node reads."""
    return [node.name for nid, node in g.nodes.items()
            if node.op == ALL_GATHER_OP and node.tags.get(RegatherTag) is None
            and any(g.nodes[u].phase is Phase.BACKWARD for u in _readers(g, nid))]


def test_regather_before_the_search_and_under_checkpointed_blocks(step: Graph) -> None:
    """The search's root gathers every decoder parameter again for the backward; checkpointing
    the blocks afterwards replays the move for the recomputes too, so no full parameter
    gathered in the forward lives into the backward but the root unit's."""
    deriver = Deriver(get_cost_model("h100"), workspace_model("auto", step.device))
    planned = Objective("latency", float("inf"))
    root, _ = _root(step, deriver, planned, False, 1.0, None)
    rooted = with_root_rewrites(root, deriver, None, planned)
    assert rooted.peak_bytes < root.peak_bytes
    kinds = {r.kind for r in rooted.recipes}
    assert kinds == {"regather"}
    move = next(m for m in children(rooted, deriver, MoveSettings(), random.Random(0))
                if m.description.startswith("checkpoint") and "blocks" in m.description)
    ckpt = move.build()
    assert any(r.kind == "regather" for r in ckpt.recipes)
    left = _forward_gathers_read_in_backward(ckpt.program)
    kept_before = _forward_gathers_read_in_backward(rooted.program)
    assert len(left) == len(kept_before) and ckpt.peak_bytes < rooted.peak_bytes


def test_plans_of_fsdp2_steps_reshard(step: Graph) -> None:
    found = optimize_graph(step, latency_limit=1.5, device="h100", time_budget=0.5, max_states=2)
    assert any("in the backward" in a for a in found.report["applied"])
