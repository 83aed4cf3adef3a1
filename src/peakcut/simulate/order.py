"""The issue order a timeline is simulated in: validated, with each node's inputs and dependencies."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain, repeat
from operator import attrgetter
from typing import cast

import numpy as np

from peakcut.ir.graph import Graph, GraphError

_INPUTS = attrgetter("input_tuple")
_OUTPUTS = attrgetter("output_tuple")


@dataclass(frozen=True, eq=False)
class IssueOrder:
    """A valid topological order of a graph, with per-position facts the simulator reads.

    Lists are aligned with `order`: inputs[i] / outputs[i] are the tensor ids node
    order[i] reads / writes (the node's input_tuple / output_tuple). The dependencies
    (a node waits for the producers of its inputs and its control dependencies) are
    edges: node `waiter[k]` waits for node `waited[k]`, both positions in the order,
    waited[k] < waiter[k]; a pair may repeat.
    """

    order: tuple[int, ...]
    position: dict[int, int]
    inputs: list[tuple[int, ...]]
    outputs: list[tuple[int, ...]]
    waiter: np.ndarray     # int64
    waited: np.ndarray     # int64

    def waits_of(self, nodes: np.ndarray) -> dict[int, list[int]]:
        """Position -> positions it waits for, for the edges whose waiter or waited node is
        marked in the boolean array `nodes` (aligned with the order)."""
        keep = nodes[self.waiter] | nodes[self.waited]
        found: dict[int, list[int]] = {}
        for i, p in zip(self.waiter[keep].tolist(), self.waited[keep].tolist(), strict=True):
            found.setdefault(i, []).append(p)
        return found


def _name(g: Graph, nid: int) -> str:
    node = g.nodes[nid]
    return f"{node.name or nid} ({node.op})"


def issue_order(g: Graph, order: Sequence[int] | None) -> IssueOrder:
    """Check that `order` (default: capture order) runs every node once, after what it depends on.

    Raises GraphError naming the first problem: a node missing, unknown or repeated,
    or a node placed before one of its producers or control dependencies.
    """
    order_t = tuple(g.order if order is None else order)
    n = len(order_t)
    position = dict(zip(order_t, range(n), strict=True))
    if len(position) != n or not position.keys() <= g.nodes.keys():
        _raise_order_problem(g, order_t)
    if len(position) != len(g.nodes):
        missing = [nid for nid in g.nodes if nid not in position]
        raise GraphError(
            f"order leaves out {len(missing)} of the graph's {len(g.nodes)} nodes, "
            f"e.g. {', '.join(_name(g, m) for m in missing[:3])}"
        )

    nodes = list(map(g.nodes.__getitem__, order_t))
    inputs = list(map(_INPUTS, nodes))
    outputs = list(map(_OUTPUTS, nodes))
    # an edge per input with a producer, and per control dependency
    producer = g.producer_map()
    flat = list(chain.from_iterable(inputs))
    # a program input has no producer (None), which has no position (-1)
    position_of = cast("Callable[[int | None, int], int]", position.get)
    waited = np.fromiter(map(position_of, map(producer.get, flat), repeat(-1)), dtype=np.int64,
                         count=len(flat))
    waiter = np.repeat(np.arange(n, dtype=np.int64), np.fromiter(map(len, inputs), dtype=np.int64,
                                                                  count=n))
    ctrl_waiter: list[int] = []
    ctrl_waited: list[int] = []
    for nid, deps in g.control.items():
        i = position.get(nid)
        if i is not None:
            ctrl_waiter.extend(repeat(i, len(deps)))
            ctrl_waited.extend(position.get(p, -2) for p in deps)   # -2: an unknown node
    waiter = np.concatenate([waiter, np.asarray(ctrl_waiter, dtype=np.int64)])
    waited = np.concatenate([waited, np.asarray(ctrl_waited, dtype=np.int64)])
    if len(waited) and ((waited[len(flat):] == -2).any() or (waited > waiter).any()):
        _raise_dependency_problem(g, order_t, position)
    keep = (waited >= 0) & (waited != waiter)   # program inputs have no producer; no self-waits
    return IssueOrder(order_t, position, inputs, outputs, waiter[keep], waited[keep])


def _raise_order_problem(g: Graph, order: tuple[int, ...]) -> None:
    """The GraphError for the first node of `order` that is unknown or repeated."""
    position: dict[int, int] = {}
    for i, nid in enumerate(order):
        if nid not in g.nodes:
            raise GraphError(f"order names node {nid}, which is not in the graph")
        if nid in position:
            raise GraphError(f"order runs {_name(g, nid)} twice (positions {position[nid]} and {i})")
        position[nid] = i


def _raise_dependency_problem(g: Graph, order: tuple[int, ...], position: dict[int, int]) -> None:
    """The GraphError for the first node of `order` (and its first dependency: producers of
    its inputs, then control dependencies) that depends on an unknown or a later node."""
    producer = g.producer_map()
    for i, nid in enumerate(order):
        reads = g.nodes[nid].input_tuple
        deps = dict.fromkeys(p for t in reads if (p := producer.get(t)) is not None)
        deps.update(dict.fromkeys(g.control.get(nid, ())))
        deps.pop(nid, None)
        for p in deps:
            j = position.get(p)
            if j is None:
                raise GraphError(f"{_name(g, nid)} depends on unknown node {p}")
            if j > i:
                raise GraphError(
                    f"order runs {_name(g, nid)} (position {i}) before {_name(g, p)} "
                    f"(position {j}) it depends on"
                )
