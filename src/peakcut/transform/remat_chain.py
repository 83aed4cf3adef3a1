"""Remat with the inputs its recompute alone would keep alive (the chain a min-cut partitioner
recomputes): after `remat(A, users)`, an input t of A' whose storage nothing but A' touches at
or after A' (it was freed in the forward: a batch norm's result read only by its ReLU) would
be held from the forward to A' just for A'. When t's producer P is cheap to run again
(element-wise or a normalization: CHAIN_KINDS) and may be recomputed (remat's own checks),
A' reads a recompute P' of it instead, placed right before A', and so on up to CHAIN_DEPTH
links. So a CNN's saved ReLU output costs a ReLU and a batch norm's normalize from its saved
statistics, and the block output of a ResNet bottleneck (relu(bn3(x) + identity)) a ReLU, an
add and a normalize, each reading only tensors the backward keeps anyway.

A link that does not apply is left out (A' then reads t as remat alone would); convolutions,
matmuls and reductions are never chained (recomputing them is block checkpointing).
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.registry import OpKind, lookup
from peakcut.transform.remat import remat, through_identities, why_not_remat
from peakcut.transform.rewrite import Rewrite, positions

CHAIN_KINDS = frozenset({OpKind.ELEMENTWISE, OpKind.NORM})
CHAIN_DEPTH = 3


def _held_only_for(g: Graph, order: Sequence[int], readers: set[int]) -> list[tuple[int, list[int]]]:
    """Tensors the nodes `readers` read that nothing else touches at or after the first of them:
    (tensor, its readers among `readers`), in the readers' order."""
    pos = positions(order)
    first = min(pos[v] for v in readers)
    found: dict[int, list[int]] = {}
    for v in sorted(readers, key=pos.__getitem__):
        for t in g.nodes[v].input_ids():
            if g.producer(t) in readers:
                continue
            found.setdefault(t, [])
            if v not in found[t]:
                found[t].append(v)
    touched_later: set[int] = set()   # storages a node other than the readers touches from `first` on
    for v in order[first:]:
        if v not in readers:
            n = g.nodes[v]
            touched_later.update(g.tensors[t].storage for t in (*n.input_tuple, *n.output_tuple))
    skip = g.caller_held_storages() | {g.tensors[t].storage for t in g.outputs} | touched_later
    return [(t, users) for t, users in found.items() if g.tensors[t].storage not in skip]


def _cheap(g: Graph, node: int) -> bool:
    info = lookup(g.nodes[node].op)
    return info is not None and info.kind in CHAIN_KINDS


def remat_chain(g: Graph, order: Sequence[int], node: int, users: Sequence[int]) -> Rewrite:
    """remat(g, order, node, users), then each input its recompute alone would hold recomputed
    too (module doc). Raises RuleError when remat itself does not apply."""
    r = remat(g, order, node, users)
    added, changed, said = list(r.added), list(r.changed), [r.description]
    frontier = set(r.added)
    for _ in range(CHAIN_DEPTH):
        links = []
        for t, readers in _held_only_for(r.graph, r.order, frontier):
            producer = r.graph.producer(t)
            if producer is None:
                continue
            root, _ = through_identities(r.graph, producer)
            if _cheap(r.graph, root) and why_not_remat(r.graph, r.order, producer, readers) is None:
                links.append((producer, readers))
        frontier = set()
        for producer, readers in links:
            if producer not in r.graph.nodes or why_not_remat(r.graph, r.order, producer, readers) is not None:
                continue
            r = remat(r.graph, r.order, producer, readers)
            added += r.added
            changed += r.changed
            said.append(r.description)
            frontier.update(r.added)
        if not frontier:
            break
    new = set(added)
    return Rewrite(graph=r.graph, order=r.order, added=tuple(added),
                   changed=tuple(dict.fromkeys(v for v in changed if v not in new)), removed=(),
                   description="; then ".join(said))
