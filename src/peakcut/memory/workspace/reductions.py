"""Reductions (sum, prod, amax, any, cumsum, ...) and mean: casts, fp32 accumulators, partials."""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from peakcut.memory.workspace.call import GRAIN_SIZE, OpCall, Rule, is_reduced_float, itemsize


def _reduced_dims(t: torch.Tensor, dim: Any) -> list[int]:
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(t.dim()))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({d % max(t.dim(), 1) for d in dims})


def _uses_fp32_acc_buffer(t: torch.Tensor, dims: Sequence[int]) -> bool:
    """ATen ``should_use_acc_buffer``: after TensorIterator moves reduced dims innermost (by stride)
    and coalesces, the first two iteration dims are both reduced."""
    reduced = set(dims)
    order = sorted((d for d in range(t.dim()) if t.shape[d] != 1 and d in reduced), key=t.stride)
    order += sorted((d for d in range(t.dim()) if t.shape[d] != 1 and d not in reduced), key=t.stride)
    groups: list[tuple[bool, int]] = []  # (is_reduced, extent in elements of the run's end)
    for d in order:
        is_red = d in reduced
        if groups and groups[-1][0] == is_red and groups[-1][1] == t.stride(d):
            groups[-1] = (is_red, t.stride(d) * t.shape[d])
        else:
            groups.append((is_red, t.stride(d) * t.shape[d]))
    return len(groups) >= 2 and groups[0][0] and groups[1][0]


def _two_pass_buffer(c: OpCall, numel_in: int, out: torch.Tensor | None, acc: torch.dtype) -> int:
    """Full reductions (one output element) of >= GRAIN_SIZE inputs keep one partial per thread."""
    if out is None or out.numel() != 1 or numel_in < GRAIN_SIZE or c.threads <= 1:
        return 0
    return c.threads * itemsize(acc)


def reduction(c: OpCall) -> int:
    """sum / prod / amax / amin / any / all / cumsum / cumprod.

    Measured: the input is cast to the output dtype when they differ (``sum`` of bool or int32 ->
    int64, ``sum(x, dtype=f64)``, ``any`` of float -> bool): ``numel * itemsize(out)``.  A bf16/f16
    ``sum`` whose two innermost reduced dims cannot coalesce (e.g. dims [0, 2, 3] of NCHW) computes
    ``sum(x.float())`` into an fp32 temporary: ``numel * 4 + out_numel * 4``.  A full reduction
    with one output element and >= 32768 inputs allocates ``nthreads * itemsize(out)`` partials
    when more than one thread is used.
    """
    x = c.tensor("self")
    out = c.out()
    if x is None or out is None:
        return 0
    base = c.family.rstrip("_")
    cast = x.numel() * itemsize(out.dtype) if x.dtype != out.dtype else 0
    acc = 0
    low_precision_sum = base in ("sum", "nansum") and is_reduced_float(x.dtype) and out.dtype == x.dtype
    if low_precision_sum and _uses_fp32_acc_buffer(x, _reduced_dims(x, c.args.get("dim"))):
        acc = x.numel() * 4 + out.numel() * 4
    partials = 0 if base in ("cumsum", "cumprod") else _two_pass_buffer(c, x.numel(), out, out.dtype)
    return cast + acc + partials


def mean(c: OpCall) -> int:
    """mean.dim / mean.default.

    Measured: CPU mean is ``sum`` then ``div_`` by the element count.  bf16/f16: the sum runs in
    fp32 on an fp32 copy of the input into an fp32 result (``numel * 4 + out_numel * 4``).  Other
    dtypes: the divisor is a wrapped int64 scalar cast to the output dtype (8 + itemsize bytes, 8
    for int64); full reductions also keep per-thread partials (not at the same time as the divisor).
    """
    x = c.tensor("self")
    out = c.out()
    if x is None or out is None:
        return 0
    if is_reduced_float(out.dtype):
        return x.numel() * 4 + out.numel() * 4 + _two_pass_buffer(c, x.numel(), out, torch.float32)
    cast = x.numel() * itemsize(out.dtype) if x.dtype != out.dtype else 0
    divisor = 8 + (0 if out.dtype == torch.int64 else itemsize(out.dtype))
    return max(cast + _two_pass_buffer(c, x.numel(), out, out.dtype), divisor)


RULES: Mapping[str, Rule] = types.MappingProxyType({
    **dict.fromkeys(("sum", "nansum", "prod", "amax", "amin", "any", "all", "cumsum", "cumprod",
                     "cumsum_"), reduction),
    "mean": mean,
})
