"""Placements in a plan's arena: where each placed tensor lies, and the source of its view.

    placement = Placement(offsets={storage: offset, ...}, outs={node: OutVariant, ...})
    view_source(meta, offset, storage_bytes)   # "arena[1024:9216].view(torch.float32).view(16, 128)"

The arena is one uint8 tensor a step allocates once and keeps across calls (codegen.program:
Step.arena). A placed node's results are views into it at their storages' offsets, made right
before the node, and the node's out overload writes into them
(`aten.mm.out(x, w, out=mm_3)`): views and in-place ops of such a tensor then live in the
arena too, since they share its storage. The offsets come from peakcut.memory.layout, over
the storages of the nodes that are placed (codegen.arena_plan decides which).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from peakcut.codegen.out_variants import OutVariant
from peakcut.ir.tensor import TensorMeta, contiguous_strides, dtype_from_name

ARENA = "arena"
"""The step's keyword (and local) holding the arena."""


@dataclass(frozen=True)
class Placement:
    """What the emitter places: storage id -> byte offset in the arena, and node id -> the out
    overload that writes its results (the nodes whose results may be placed)."""

    offsets: Mapping[int, int]
    outs: Mapping[int, OutVariant]
    arena_bytes: int


def view_source(meta: TensorMeta, offset: int, storage_bytes: int) -> str:
    """The source of tensor `meta` as a view into the arena, its storage at byte `offset` and
    `storage_bytes` long: a typed slice shaped as the tensor (as_strided where the tensor is
    not the whole of its storage, contiguous)."""
    dtype = dtype_from_name(meta.dtype)
    typed = f"{ARENA}[{offset}:{offset + storage_bytes}].view({dtype})"
    whole = meta.numel * dtype.itemsize == storage_bytes and meta.storage_offset == 0
    if whole and tuple(meta.stride) == contiguous_strides(meta.shape):
        return f"{typed}.view({_ints(meta.shape)})"
    first = offset // dtype.itemsize + meta.storage_offset
    return f"{typed}.as_strided({_ints(meta.shape)}, {_ints(meta.stride)}, {first})"


def _ints(values: tuple[int, ...]) -> str:
    return f"({values[0]},)" if len(values) == 1 else f"({', '.join(map(str, values))})"
