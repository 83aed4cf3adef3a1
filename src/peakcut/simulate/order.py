"""The issue order a timeline is simulated in: validated, with each node's inputs and dependencies."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph, GraphError


@dataclass(frozen=True)
class Schedule:
    """A valid topological order of a graph, with per-position facts the simulator reads.

    Lists are aligned with `order`: inputs[i] / outputs[i] are the tensor ids node
    order[i] reads / writes, preds[i] the positions of the nodes it must wait for
    (producers of its inputs and its control dependencies), all smaller than i.
    """

    order: tuple[int, ...]
    position: dict[int, int]
    inputs: list[list[int]]
    outputs: list[list[int]]
    preds: list[list[int]]


def _name(g: Graph, nid: int) -> str:
    node = g.nodes[nid]
    return f"{node.name or nid} ({node.op})"


def make_schedule(g: Graph, order: Sequence[int] | None) -> Schedule:
    """Check that `order` (default: capture order) runs every node once, after what it depends on.

    Raises GraphError naming the first problem: a node missing, unknown or repeated,
    or a node placed before one of its producers or control dependencies.
    """
    order_t = tuple(g.order if order is None else order)
    position: dict[int, int] = {}
    for i, nid in enumerate(order_t):
        if nid not in g.nodes:
            raise GraphError(f"order names node {nid}, which is not in the graph")
        if nid in position:
            raise GraphError(f"order runs {_name(g, nid)} twice (positions {position[nid]} and {i})")
        position[nid] = i
    if len(position) != len(g.nodes):
        missing = [nid for nid in g.nodes if nid not in position]
        raise GraphError(
            f"order leaves out {len(missing)} of the graph's {len(g.nodes)} nodes, "
            f"e.g. {', '.join(_name(g, m) for m in missing[:3])}"
        )

    inputs: list[list[int]] = []
    outputs: list[list[int]] = []
    preds: list[list[int]] = []
    producer = g.producer
    for i, nid in enumerate(order_t):
        node = g.nodes[nid]
        reads = node.input_ids()
        deps: dict[int, None] = {}
        for t in reads:
            p = producer(t)
            if p is not None:
                deps[p] = None
        for p in g.control.get(nid, ()):
            deps[p] = None
        deps.pop(nid, None)
        pred_pos: list[int] = []
        for p in deps:
            j = position.get(p)
            if j is None:
                raise GraphError(f"{_name(g, nid)} depends on unknown node {p}")
            if j > i:
                raise GraphError(
                    f"order runs {_name(g, nid)} (position {i}) before {_name(g, p)} "
                    f"(position {j}) it depends on"
                )
            pred_pos.append(j)
        inputs.append(reads)
        outputs.append(node.output_ids())
        preds.append(pred_pos)
    return Schedule(order_t, position, inputs, outputs, preds)
