"""A sparse matrix times a dense one, as an op over the sparse matrix's dense parts.

A captured step holds dense tensors only. ``torch.sparse.mm(A, X)`` with a COO or CSR matrix
``A`` built in the step (``torch.sparse_coo_tensor(indices, values, size)``,
``torch.sparse_csr_tensor(crow, col, values, size)``) is captured as
``peakcut::spmm(layout, index_a, index_b, values, dense, rows, cols, transposed)``: the
matrix's index tensors and values are its inputs, and it runs the very kernel eager runs,
``torch.sparse.mm`` over the matrix rebuilt from them (no copy of the indices, a view of
the values). Its gradient with respect to ``dense`` is the same op on the transposed matrix
(``A.t() @ grad``, as eager's); with respect to ``values``, the sum over each stored element of
``grad[row] . dense[col]``.

Pricing (peakcut.ir.registry): 2 * nnz * width FLOPs; bytes: the indices and values, one row
of ``dense`` gathered per stored element, and the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

SPMM_OP = "peakcut.spmm.default"
LAYOUTS = ("coo", "csr")


def sparse_matrix(layout: str, index_a: torch.Tensor, index_b: torch.Tensor, values: torch.Tensor,
                  rows: int, cols: int) -> torch.Tensor:
    """The sparse matrix of `layout` ('coo': index_a the [2, nnz] indices, index_b unused; 'csr':
    crow and col indices) with `values`, of size rows x cols."""
    if layout == "coo":
        return torch.sparse_coo_tensor(index_a, values, (rows, cols))
    if layout == "csr":
        return torch.sparse_csr_tensor(index_a, index_b, values, (rows, cols))
    raise ValueError(f"spmm: layout {layout!r}; expected one of {', '.join(LAYOUTS)}")


@torch.library.custom_op("peakcut::spmm", mutates_args=())
def spmm(layout: str, index_a: torch.Tensor, index_b: torch.Tensor, values: torch.Tensor, dense: torch.Tensor,
         rows: int, cols: int, transposed: bool) -> torch.Tensor:
    """``A @ dense`` (``A.t() @ dense`` when `transposed`) for the rows x cols sparse matrix A."""
    matrix = sparse_matrix(layout, index_a, index_b, values, rows, cols)
    with torch.no_grad():
        out: torch.Tensor = torch.sparse.mm(matrix.t() if transposed else matrix, dense)
    return out


@spmm.register_fake
def _spmm_fake(layout: str, index_a: torch.Tensor, index_b: torch.Tensor, values: torch.Tensor,
               dense: torch.Tensor, rows: int, cols: int, transposed: bool) -> torch.Tensor:
    return dense.new_empty((cols if transposed else rows, dense.shape[1]))


def _coo_rows_cols(layout: str, index_a: torch.Tensor, index_b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "coo":
        return index_a[0], index_a[1]
    coo = torch._convert_indices_from_csr_to_coo(index_a, index_b)
    return coo[0], coo[1]


def _setup(ctx: Any, inputs: Sequence[Any], output: torch.Tensor) -> None:
    layout, index_a, index_b, values, dense, rows, cols, transposed = inputs
    ctx.layout, ctx.rows, ctx.cols, ctx.transposed = layout, rows, cols, transposed
    ctx.save_for_backward(index_a, index_b, values, dense if ctx.needs_input_grad[3] else None)


def _backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    index_a, index_b, values, dense = ctx.saved_tensors
    grad_dense = grad_values = None
    if ctx.needs_input_grad[4]:
        grad_dense = torch.ops.peakcut.spmm(ctx.layout, index_a, index_b, values, grad, ctx.rows, ctx.cols,
                                            not ctx.transposed)
    if ctx.needs_input_grad[3]:
        row, col = _coo_rows_cols(ctx.layout, index_a, index_b)
        out_rows, in_rows = (col, row) if ctx.transposed else (row, col)
        grad_values = (grad.index_select(0, out_rows) * dense.index_select(0, in_rows)).sum(1)
    return None, None, None, grad_values, grad_dense, None, None, None


spmm.register_autograd(_backward, setup_context=_setup)


def spmm_flops(shapes: Sequence[tuple[int, ...]]) -> int:
    """2 * nnz * width: one multiply-add per stored element and column of the dense operand
    (shapes: those of the call's tensor arguments in order: index_a, index_b, values, dense)."""
    values, dense = shapes[2], shapes[3]
    return 2 * values[0] * (dense[1] if len(dense) > 1 else 1)


def spmm_gathered_bytes(args: Sequence[Any]) -> int:
    """Bytes the call reads beyond one touch of each argument: a row of the dense operand per
    stored element (nnz * width) instead of the dense operand once."""
    values, dense = args[3], args[4]
    if not isinstance(values, torch.Tensor) or not isinstance(dense, torch.Tensor) or dense.dim() != 2:
        return 0
    gathered = values.shape[0] * dense.shape[1] * dense.element_size()
    return max(0, gathered - dense.numel() * dense.element_size())
