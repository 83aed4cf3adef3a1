"""Placement of swap and recompute nodes in an order (MAGIS §5.2; the reference code never did loads).

- a Store runs as early as possible: right after the node that produces its tensor;
- a Load runs as late as its transfer can still be hidden: it is issued early
  enough that the compute nodes between it and its first consumer take at
  least the transfer time (when copies overlap compute; on CPU they do not,
  so it runs right before the consumer);
- a recompute runs right before its first consumer.

Every move keeps the order topological: a node never passes one of its
predecessors or successors.
"""

from __future__ import annotations

from peakcut.cost.protocol import CostModel
from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP, STORE_OP


def place(g: Graph, order: list[int], cost: CostModel | None = None) -> list[int]:
    """`order` with stores early, loads just early enough, recomputes late (see module doc)."""
    order = list(order)
    for nid in [n for n in order if g.nodes[n].op == STORE_OP]:
        order = _move_early(g, order, nid)
    for nid in [n for n in order if "remat_of" in g.nodes[n].extra]:
        order = _move_late(g, order, nid, 0.0, cost)
    for nid in [n for n in order if g.nodes[n].op == LOAD_OP]:
        seconds = cost.node_seconds(g, nid) if cost is not None and cost.overlap_copies else 0.0
        order = _move_late(g, order, nid, seconds, cost)
    return order


def _successors(g: Graph, nid: int) -> set[int]:
    out = {u for t in g.nodes[nid].output_ids() for u in g.users(t)}
    out |= {n for n, deps in g.control.items() if nid in deps}
    out.discard(nid)
    return out


def _move_early(g: Graph, order: list[int], nid: int) -> list[int]:
    preds = g.predecessors(nid)
    rest = [n for n in order if n != nid]
    at = max((i for i, n in enumerate(rest) if n in preds), default=-1) + 1
    return rest[:at] + [nid] + rest[at:]


def _move_late(g: Graph, order: list[int], nid: int, hide_seconds: float, cost: CostModel | None) -> list[int]:
    """Place nid before its first successor, early enough that `hide_seconds` of compute precede it."""
    succs = _successors(g, nid)
    preds = g.predecessors(nid)
    rest = [n for n in order if n != nid]
    first_succ = next((i for i, n in enumerate(rest) if n in succs), len(rest))
    earliest = max((i for i, n in enumerate(rest) if n in preds), default=-1) + 1
    at = first_succ
    covered = 0.0
    while at > earliest and covered < hide_seconds:
        prev = rest[at - 1]
        if g.nodes[prev].op in (STORE_OP, LOAD_OP):
            at -= 1
            continue
        covered += cost.node_seconds(g, prev) if cost is not None else 0.0
        at -= 1
    return rest[:at] + [nid] + rest[at:]
