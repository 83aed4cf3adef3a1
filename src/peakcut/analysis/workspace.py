"""Transient workspace of a graph node, from the per-device rules in peakcut.ir.workspace."""

from __future__ import annotations

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef, map_refs

WORKSPACE_MODELS = ("cpu",)


def node_workspace(g: Graph, nid: int, model: str) -> int:
    """Bytes a node allocates and frees while it runs, beyond its outputs."""
    from peakcut.ir.workspace import WORKSPACE_OPS, cpu_workspace_bytes

    if model != "cpu":
        raise ValueError(f"unknown workspace model {model!r}; known: {WORKSPACE_MODELS}")
    node = g.nodes[nid]
    if node.op not in WORKSPACE_OPS:
        return 0
    cached = g.workspace_cache.get(nid)
    if cached is not None:
        return cached

    def to_meta(ref: TensorRef) -> torch.Tensor:
        return g.tensors[ref.id].to_meta()

    args = map_refs(node.args, to_meta)
    kwargs = map_refs(node.kwargs, to_meta)
    outs = [g.tensors[t].to_meta() for t in node.output_ids()]
    value = int(cpu_workspace_bytes(node.overload(), tuple(args), kwargs, outs))
    g.workspace_cache[nid] = value
    return value
