"""Recompute a step's cheap saved activations for the backward, keeping what the matmuls and
convolutions made (what torch.compile's min-cut partitioner saves): each element-wise op
whose output the backward reads (a ReLU's output, a ResNet block's relu(bn(x) + identity))
is recomputed with remat_chain for its readers after the forward, so its output and the
cheap inputs behind it (a batch norm's result: its normalize from the saved statistics) are
freed after the forward.

The ops are taken last to first, so that one recompute serves every later reader: when a
block's output is recomputed, the recompute of the next block's add (which reads it) is
already in the graph and is one of its readers. One Rewrite for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.registry import OpKind, lookup
from peakcut.transform.remat import why_not_remat
from peakcut.transform.remat_chain import remat_chain
from peakcut.transform.rewrite import Rewrite, identity_views


def _later_readers(g: Graph, node: int) -> list[int]:
    """The readers outside the forward of node's one output or of its identity views, by id
    (remat orders them; a walk of the order here made the rule's sites quadratic)."""
    (out,) = g.nodes[node].output_ids()
    tensors = (out, *identity_views(g, out))
    return sorted({u for t in tensors for u in g.users(t) if g.nodes[u].phase is not Phase.FORWARD})


def saved_activations(g: Graph) -> list[int]:
    """Forward element-wise ops with one output that a node outside the forward reads (directly or
    through an identity view), in forward order."""
    found = []
    for v in g.order:
        n = g.nodes[v]
        info = lookup(n.op)
        if (n.phase is Phase.FORWARD and info is not None and info.kind is OpKind.ELEMENTWISE
                and len(n.output_ids()) == 1 and n.tags.remat is None and _later_readers(g, v)):
            found.append(v)
    return found


def why_not_recompute_activation(g: Graph, order: Sequence[int], node: int) -> str | None:
    """Why the readers after the forward of `node`'s output cannot read a recompute (None: they can)."""
    if node not in g.nodes:
        return f"node {node} is not in the graph"
    readers = _later_readers(g, node)
    if not readers:
        return f"nothing outside the forward reads the output of {g.nodes[node].name or node}"
    return why_not_remat(g, order, node, readers)


def recompute_activations(g: Graph, order: Sequence[int], nodes: Sequence[int]
                          ) -> tuple[Rewrite | None, list[str | None]]:
    """Every node of `nodes` that can be, recomputed for its readers after the forward (module
    doc); the reason per node (None: done). The Rewrite is None when none could."""
    pos = {v: i for i, v in enumerate(g.order)}
    reasons: dict[int, str | None] = {}
    current, current_order = g, list(order)
    added: list[int] = []
    changed: list[int] = []
    for v in sorted(nodes, key=lambda v: -pos.get(v, -1)):
        reason = why_not_recompute_activation(current, current_order, v)
        reasons[v] = reason
        if reason is None:
            r = remat_chain(current, current_order, v, _later_readers(current, v))
            current, current_order = r.graph, r.order
            added += r.added
            changed += r.changed
    done = [v for v in nodes if reasons[v] is None]
    if not done:
        return None, [reasons[v] for v in nodes]
    new = set(added)
    return Rewrite(graph=current, order=current_order, added=tuple(added),
                   changed=tuple(dict.fromkeys(v for v in changed if v not in new)), removed=(),
                   description=f"recompute {len(done)} saved activations (and the cheap ops behind them) "
                               "for the backward"), [reasons[v] for v in nodes]
