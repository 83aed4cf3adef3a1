"""Transient workspace of a graph node, from the per-device rules in peakcut.ir.workspace."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef, map_refs

WORKSPACE_MODELS = ("cpu",)


def _check_model(model: str) -> None:
    if model != "cpu":
        raise ValueError(f"unknown workspace model {model!r}; known: {WORKSPACE_MODELS}")


def node_workspace(g: Graph, nid: int, model: str) -> int:
    """Bytes a node allocates and frees while it runs, beyond its outputs."""
    from peakcut.ir.workspace import WORKSPACE_OPS

    _check_model(model)
    if g.nodes[nid].op not in WORKSPACE_OPS:
        return 0
    return _cached_workspace(g, nid)


def order_workspace(g: Graph, order: Sequence[int], model: str) -> np.ndarray:
    """node_workspace of every node of `order`, as int64 (zeros for an empty order)."""
    from peakcut.ir.workspace import WORKSPACE_OPS

    ws = np.zeros(len(order), dtype=np.int64)
    if len(order):
        _check_model(model)
    nodes = g.nodes
    cache = g.workspace_cache
    for i, nid in enumerate(order):
        if nodes[nid].op in WORKSPACE_OPS:
            value = cache.get(nid)
            ws[i] = _cached_workspace(g, nid) if value is None else value
    return ws


_MEMO = "analysis.workspace"   # Node.memo key: (the node's input and output metas, workspace bytes)


def _cached_workspace(g: Graph, nid: int) -> int:
    """The workspace of a node whose op has a rule, from g.workspace_cache when there, else from
    the node's memo when its tensors' metas are those it was computed for (graphs derived from
    one another share node objects: part copies of a reused expansion, rewritten programs)."""
    from peakcut.ir.workspace import cpu_workspace_bytes

    cached = g.workspace_cache.get(nid)
    if cached is not None:
        return cached
    node = g.nodes[nid]
    tensors = g.tensors
    metas = tuple([tensors[t] for t in node.input_tuple] + [tensors[t] for t in node.output_tuple])
    hit = node.memo.get(_MEMO)
    if hit is not None and hit[0] == metas:
        g.workspace_cache[nid] = hit[1]
        return hit[1]

    def to_meta(ref: TensorRef) -> torch.Tensor:
        return g.tensors[ref.id].to_meta()

    args = map_refs(node.args, to_meta)
    kwargs = map_refs(node.kwargs, to_meta)
    outs = [g.tensors[t].to_meta() for t in node.output_ids()]
    value = int(cpu_workspace_bytes(node.overload(), tuple(args), kwargs, outs))
    g.workspace_cache[nid] = value
    node.memo[_MEMO] = (metas, value)
    return value
