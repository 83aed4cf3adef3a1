"""What a node's call looks like to a cost model: its key, its meta tensors, its work.

A *call key* names everything that decides an op's latency: the op overload, every tensor
argument's shape, stride and dtype, and the repr of every other argument. Two nodes with
the same key cost the same, so both cost models cache per key. Devices are rendered as
``device``: a cost model prices a call on its own device, whatever the graph was captured on.
A run-time scalar (ir.node.Hyper: an optimizer hyper-parameter the program reads at every
call) is rendered as ``hyper``: its name and captured value do not change what the call
costs, so the update's calls of every parameter of one shape share one key (BERT-base's
AdamW: 595 keys in all with names, 207 without). An in-place index_add_ that carries the rows
its index names (ir.tags.NamedRowsTag) adds them to its key, and its work (node_work, which the
analytic and fitted prices read) counts those rows of its destination; a measured price times
the call on synthetic indices, whatever the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import Hyper, TensorRef, map_refs
from peakcut.ir.ops import COPY_DIRECTION, copied_argument, is_host_copy
from peakcut.ir.registry import (
    INDEX_ADD_,
    OpKind,
    bytes_moved,
    flops,
    index_add_untouched,
    lookup,
    reread_bytes,
    unread_bytes,
)
from peakcut.ir.tags import NamedRowsTag
from peakcut.ir.tensor import TensorMeta


def tensor_layout(meta: TensorMeta) -> str:
    """'T[4,64;64,1;float32]': shape; stride; dtype."""
    shape = ",".join(map(str, meta.shape))
    stride = ",".join(map(str, meta.stride))
    return f"T[{shape};{stride};{meta.dtype}]"


_PLAIN = frozenset({int, float, bool, str, type(None)})
"""Argument types rendered by their repr (checked first: most arguments are of these)."""


def _render(value: Any, g: Graph) -> str:
    """Deterministic text of one argument, tensors by layout, run-time scalars as 'hyper'."""
    if type(value) in _PLAIN:
        return repr(value)
    if isinstance(value, TensorRef):
        return tensor_layout(g.tensors[value.id])
    if isinstance(value, Hyper):
        return "hyper"
    if isinstance(value, torch.device):
        return "device"
    if isinstance(value, list):
        return "[" + ", ".join(_render(v, g) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_render(v, g) for v in value) + ")"
    if isinstance(value, dict):
        items = sorted(value.items(), key=lambda kv: str(kv[0]))
        return "{" + ", ".join(f"{k}: {_render(v, g)}" for k, v in items) + "}"
    return repr(value)


def call_key(g: Graph, nid: int) -> str:
    """The cost key of node `nid`: op, tensor layouts, other arguments."""
    node = g.nodes[nid]
    args = [_render(a, g) for a in node.args]
    kwargs = [f"{k}={_render(v, g)}" for k, v in sorted(node.kwargs.items())]
    rows = _named_rows(g, nid)
    return f"{node.op}({', '.join(args + kwargs)})" + ("" if rows is None else f"[rows {rows}]")


def _named_rows(g: Graph, nid: int) -> int | None:
    """The rows an in-place index_add_'s index names, where its NamedRowsTag says (else None)."""
    node = g.nodes[nid]
    if node.op != INDEX_ADD_:
        return None
    tag = node.tags.get(NamedRowsTag)
    return None if tag is None else tag.rows


def copy_key(nbytes: int, direction: str) -> str:
    """The cost key of a host<->device copy of `nbytes` bytes."""
    return f"copy:{direction}:{nbytes}"


def is_swap(g: Graph, nid: int) -> bool:
    """True for host copy nodes (peakcut.store / load / writeback)."""
    return is_host_copy(g.nodes[nid].op)


def swap_transfer(g: Graph, nid: int) -> tuple[int, str]:
    """(bytes copied, "d2h" | "h2d") of a host copy node (peakcut.store / load / writeback)."""
    node = g.nodes[nid]
    if not is_host_copy(node.op):
        raise ValueError(f"node {nid} ({node.op}) is not a host copy node")
    source = node.args[copied_argument(node.op)]
    if not isinstance(source, TensorRef):
        raise ValueError(f"node {nid} ({node.op}): argument {copied_argument(node.op)} is not a tensor")
    return g.tensors[source.id].nbytes, COPY_DIRECTION[node.op]


@dataclass(frozen=True)
class NodeWork:
    """The work of one call: what kind of op, FLOPs, bytes moved, the dtype it computes in."""

    kind: OpKind | None  # None: an opaque op (not in the registry)
    flops: int
    bytes: int
    dtype: str


def node_work(g: Graph, nid: int) -> NodeWork:
    """FLOPs and bytes of node `nid` from the op registry, evaluated on meta tensors."""
    node = g.nodes[nid]

    def to_meta(ref: TensorRef) -> torch.Tensor:
        return g.tensors[ref.id].to_meta()

    args = map_refs(node.args, to_meta)
    kwargs = map_refs(node.kwargs, to_meta)
    out_metas = [g.tensors[t] for t in node.output_ids()]
    outputs = [m.to_meta() for m in out_metas]
    # per output position, None where the call makes none (a convolution backward's masked-off
    # gradients): FLOP rules index their results by position
    placed = [None if t is None else g.tensors[t].to_meta() for t in node.outputs]
    in_metas = [g.tensors[t] for t in node.input_ids()]
    inputs = [m.to_meta() for m in in_metas]
    info = lookup(node.op)
    kind = info.kind if info is not None else None
    rows = _named_rows(g, nid)
    unread = unread_bytes(node.op, tuple(args)) if rows is None else index_add_untouched(tuple(args), rows)
    return NodeWork(
        kind=kind,
        flops=flops(node.op, tuple(args), kwargs, placed),
        bytes=bytes_moved(inputs, outputs) + reread_bytes(node.op, tuple(args)) - unread,
        dtype=_compute_dtype(in_metas, out_metas),
    )


def _compute_dtype(inputs: list[TensorMeta], outputs: list[TensorMeta]) -> str:
    """The first floating (or complex) dtype among inputs, then outputs; else float32."""
    for meta in (*inputs, *outputs):
        dtype = meta.torch_dtype
        if dtype.is_floating_point or dtype.is_complex:
            return meta.dtype
    return "float32"
