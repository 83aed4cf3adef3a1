"""Sorting, indexing, embedding, upsampling and repeat: index scratch, tables, contiguous copies."""

from __future__ import annotations

import types
from collections.abc import Mapping

import torch

from peakcut.memory.workspace.call import OpCall, Rule, contiguous_copy, nbytes


def sort(c: OpCall) -> int:
    """sort / argsort: an int64 scratch of the sorted dim's length (``size(dim) * 8``); argsort
    also builds (and drops) the sorted values (measured, independent of threads)."""
    x = c.tensor("self")
    if x is None:
        return 0
    dim = c.args.get("dim", -1)
    length = x.shape[dim] if x.dim() > 0 else 1
    values = nbytes(x) if c.family == "argsort" else 0
    return length * 8 + values


def index_int32(c: OpCall) -> int:
    """index / index_put / _unsafe_index{,_put}: int32 indices are converted to int64 (``numel*8``)."""
    indices = c.args.get("indices") or []
    return sum(i.numel() * 8 for i in indices if isinstance(i, torch.Tensor) and i.dtype == torch.int32)


def embedding(c: OpCall) -> int:
    """embedding / embedding_dense_backward / index_select: non-contiguous ``indices`` (``index``),
    and for the backward ``grad_output``, are copied contiguous first (measured: an expanded
    ``token_type_ids`` buffer costs ``numel * 8``)."""
    return sum(contiguous_copy(c.tensor(n)) for n in ("indices", "index", "grad_output"))


_UPSAMPLE_TAPS = types.MappingProxyType({
    "upsample_nearest1d": 1, "upsample_nearest2d": 1, "upsample_nearest3d": 1,
    "_upsample_nearest_exact1d": 1, "_upsample_nearest_exact2d": 1, "_upsample_nearest_exact3d": 1,
    "upsample_linear1d": 2, "upsample_bilinear2d": 2, "upsample_trilinear3d": 2,
    "upsample_bicubic2d": 4,
})


def upsample(c: OpCall) -> int:
    """upsample_* forward.

    Measured: 2-D nearest/bilinear use the vectorized channels-last kernel when the input is
    channels-last with C > 3 or when ``H_out + W_out <= 128``; then a non-channels-last input is
    copied to channels-last and the result computed into a channels-last temporary
    (``in_bytes + out_bytes``).  Otherwise the generic kernel builds per output coordinate and tap an
    int64 index and a weight (``taps * O_d * (8 + itemsize)`` per spatial dim); bicubic and 1-D/3-D
    always take the generic kernel (3-D channels-last with C > 3 excepted: 0).
    """
    x = c.tensor("input") if c.tensor("input") is not None else c.tensor("self")
    out = c.out()
    if x is None or out is None:
        return 0
    family = c.family
    spatial = x.dim() - 2
    taps = _UPSAMPLE_TAPS.get(family, 1)
    channels = x.shape[1]
    if spatial == 2 and taps <= 2:
        cl = x.is_contiguous(memory_format=torch.channels_last)
        if (cl and channels > 3) or out.shape[-1] + out.shape[-2] <= 128:
            return 0 if cl else nbytes(x) + nbytes(out)
    if spatial == 3 and taps <= 2 and channels > 3 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return 0
    return sum(taps * o * (8 + x.element_size()) for o in out.shape[2:])


def repeat(c: OpCall) -> int:
    """repeat: small size/stride vectors, ``32 * ndim`` bytes at the peak (measured)."""
    repeats = c.args.get("repeats") or []
    return 32 * len(repeats)


RULES: Mapping[str, Rule] = types.MappingProxyType({
    "sort": sort,
    "argsort": sort,
    **dict.fromkeys(("index", "_unsafe_index", "index_put", "index_put_", "_unsafe_index_put"), index_int32),
    **dict.fromkeys(_UPSAMPLE_TAPS, upsample),
    "repeat": repeat,
    **dict.fromkeys(("embedding", "embedding_dense_backward", "index_select"), embedding),
})
