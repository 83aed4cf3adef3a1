"""The head-and-loss region, an F-Tree candidate beyond Algorithm 1's dominator regions: what
runs after a model's last repeated block and before that block's backward (a language model's
vocabulary projection, its log-softmax and loss, their backward and the head's weight
gradients). Its tensors are the largest of many steps (BERT-base at batch 32 and sequence 512:
three batch x sequence x vocabulary fp32 tensors, 1.9 GiB each, live together), and split
into parts along the batch it holds one part's at a time (the loss computed in chunks),
at the cost of a few dozen more calls. Dominator regions do not isolate it: the region a
dominator heads that holds the loss also holds the whole forward.
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.fission.analyzer import ComponentView
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.transform.checkpoint import find_blocks


def head_candidates(g: Graph, views: Sequence[ComponentView]) -> list[tuple[frozenset[int], ComponentView, int]]:
    """(region, component, the node it centres on) of the head-and-loss region in each
    component that holds it; none for a step without repeated blocks or a loss."""
    lists = find_blocks(g)
    if not lists:
        return []
    pos = {v: i for i, v in enumerate(g.order)}
    last = max((b for blocks in lists.values() for b in blocks), key=lambda b: max(pos[v] for v in b.nodes))
    start = max(pos[v] for v in last.nodes)
    prefix = last.module + "."
    ends = [pos[v] for v in g.order[start + 1:] if g.nodes[v].phase is Phase.BACKWARD
            and (g.nodes[v].module == last.module or g.nodes[v].module.startswith(prefix))]
    loss = [v for v in g.order[start + 1:] if g.nodes[v].phase is Phase.LOSS]
    if not ends or not loss:
        return []
    inside = set(g.order[start + 1:min(ends)])
    found = []
    for view in views:
        region = frozenset(v for v in view.labels if v in inside)
        if region and any(v in region for v in loss):
            found.append((region, view, next(v for v in loss if v in region)))
    return found

