"""Matrix products (mm, addmm, bmm, baddbmm): operand copies and oneDNN's bf16 matmul scratch."""

from __future__ import annotations

import types
from collections.abc import Mapping

import torch

from peakcut.memory.workspace.call import OpCall, Rule, is_reduced_float, nbytes


def _blas_ok(t: torch.Tensor) -> bool:
    """A matrix BLAS can read in place: one of its last two strides is 1 (leading dim large enough)."""
    rows, cols = t.shape[-2], t.shape[-1]
    s_r, s_c = t.stride(-2), t.stride(-1)
    return (s_c == 1 and (rows == 1 or s_r >= max(1, cols))) or (
        s_r == 1 and (cols == 1 or s_c >= max(1, rows))
    )


def _batch_dense(t: torch.Tensor) -> bool:
    return t.dim() < 3 or t.shape[0] == 1 or t.stride(0) == t.shape[-1] * t.shape[-2]


_MATMUL_OPERANDS = types.MappingProxyType({
    "mm": ("self", "mat2"), "bmm": ("self", "mat2"), "addmm": ("mat1", "mat2"), "addmm_": ("mat1", "mat2"),
    "baddbmm": ("batch1", "batch2"),
})


def matmul(c: OpCall) -> int:
    """mm / addmm / addmm_ / bmm / baddbmm.

    Measured fp32/fp64 (MKL): 0, except an operand neither of whose last two strides is 1 is
    cloned contiguous.  bf16/fp16 go through oneDNN matmul: an operand is cloned unless it is
    BLAS-readable with a dense batch stride, plus a scratchpad of ``base + nthreads * per_thread``
    with ``per_thread ~= 4 * min(M, 64) * min(N, 512) + 640`` (base 384 and 640: the machine's
    OneDnnFit matmul_scratch_base / _per_thread) (+ ``2 * K * min(M, 256)`` when A is
    transposed, + ``2 * K * 64`` when M < 16, + ``2 * K * 32`` when N < 16) -- exact for large
    row-major operands, approximate otherwise.
    """
    a_name, b_name = _MATMUL_OPERANDS[c.family]
    a, b = c.tensor(a_name), c.tensor(b_name)
    if a is None or b is None:
        return 0
    if not is_reduced_float(a.dtype):
        return sum(nbytes(t) for t in (a, b) if not _blas_ok(t))
    copies = sum(nbytes(t) for t in (a, b) if not (_blas_ok(t) and _batch_dense(t)))
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if m * n * k < 4096 or min(m, n, k) == 0:
        return copies
    fit = c.machine.fit
    per_thread = 4 * min(m, 64) * min(n, 512) + fit.matmul_scratch_per_thread
    if a.stride(-1) != 1:
        per_thread += 2 * k * min(m, 256)
    if m < 16:
        per_thread += 2 * k * 64
    if n < 16:
        per_thread += 2 * k * 32
    return copies + fit.matmul_scratch_base + c.threads * per_thread


RULES: Mapping[str, Rule] = types.MappingProxyType(dict.fromkeys(("mm", "addmm", "addmm_", "bmm", "baddbmm"), matmul))
