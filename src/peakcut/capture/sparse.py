"""Sparse COO and CSR matrices built in the step, captured through their dense parts.

A captured step holds dense tensors only, so a sparse matrix the user's code builds from
index tensors (``torch.sparse_coo_tensor(indices, values, size)``,
``torch.sparse_csr_tensor(crow, col, values, size)``) is not traced as a tensor: it is made
outside the trace, and what the code does with it is captured over its parts. A product
with a dense matrix (``torch.sparse.mm``, ``torch.mm``, ``torch.spmm``, ``torch.matmul``,
``A @ X``) becomes ``peakcut::spmm`` (``peakcut.ir.sparse_ops``), which runs eager's kernel;
``A.t()`` and ``A.coalesce()`` (a product sums duplicates either way) are followed; the
matrix the user's code holds is a stand-in on the meta device of the same size. Anything
else done with such a matrix, or a sparse tensor given as a batch tensor, parameter or
buffer, is refused with a CaptureError naming the call and what to write instead.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from peakcut.capture.errors import CaptureError
from peakcut.ir import sparse_ops  # noqa: F401  (registers peakcut::spmm)

_PRODUCTS: frozenset[Callable[..., Any]] = frozenset({
    torch.sparse.mm, torch.mm, torch.spmm, torch.matmul, torch.Tensor.mm, torch.Tensor.matmul,
    torch.Tensor.__matmul__})
_METADATA: frozenset[Any] = frozenset({
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.shape.__get__, torch.Tensor.dtype.__get__,  # type: ignore[attr-defined]
    torch.Tensor.device.__get__, torch.Tensor.layout.__get__, torch.Tensor.is_sparse.__get__,  # type: ignore[attr-defined]
    torch.Tensor.requires_grad.__get__, torch.Tensor.ndim.__get__, torch.Tensor.is_sparse_csr.__get__,  # type: ignore[attr-defined]
    torch.Tensor.__len__, torch.Tensor.numel})
USE_INSTEAD = ("peakcut captures a sparse matrix built in the step from index tensors "
               "(torch.sparse_coo_tensor(indices, values, size) or torch.sparse_csr_tensor(crow, col, values, "
               "size)) and multiplied with a dense one (torch.sparse.mm(A, X)); or write the product over the "
               "edge list: out.index_add_(0, dst, x.index_select(0, src) * w.unsqueeze(1))")


@dataclass(frozen=True)
class _Parts:
    """A sparse matrix's dense parts: layout, index tensors, values, size, transposed or not."""

    layout: str
    index_a: torch.Tensor
    index_b: torch.Tensor
    values: torch.Tensor
    rows: int
    cols: int
    transposed: bool = False


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], position: int, name: str) -> Any:
    return args[position] if len(args) > position else kwargs.get(name)


class SparseLowering(TorchFunctionMode):
    """While a step is traced: sparse matrices made outside the trace, their products as
    peakcut::spmm over their parts (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._parts: dict[int, tuple[torch.Tensor, _Parts]] = {}

    def around(self, step: Callable[..., Any]) -> Callable[..., Any]:
        """`step` run with this mode on (inside capture.constants.ClosedOver's, so that the
        stand-ins never reach it)."""
        def lowered(*args: Any) -> Any:
            with self:
                return step(*args)
        return lowered

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.sparse_coo_tensor:
            size = _argument(args, kwargs, 2, "size")
            if size is None:
                raise CaptureError("torch.sparse_coo_tensor without a size infers it from the largest index, "
                                   "a data-dependent size: give size=(rows, cols)")
            indices, values = _argument(args, kwargs, 0, "indices"), _argument(args, kwargs, 1, "values")
            return self._made(_Parts("coo", indices, indices, values, int(size[0]), int(size[1])))
        if func is torch.sparse_csr_tensor:
            size = _argument(args, kwargs, 3, "size")
            if size is None:
                raise CaptureError("torch.sparse_csr_tensor without a size infers it from the indices, "
                                   "a data-dependent size: give size=(rows, cols)")
            crow, col, values = (_argument(args, kwargs, i, n) for i, n in enumerate(("crow_indices", "col_indices",
                                                                                        "values")))
            return self._made(_Parts("csr", crow, col, values, int(size[0]), int(size[1])))
        known = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor) and id(a) in self._parts]
        if not known:
            return func(*args, **kwargs)
        if func in _METADATA:
            return func(*args, **kwargs)
        first = args[0] if args else None
        parts = self._parts[id(first)][1] if isinstance(first, torch.Tensor) and id(first) in self._parts else None
        if func in _PRODUCTS and parts is not None and len(args) == 2 and len(known) == 1 \
                and isinstance(args[1], torch.Tensor) and args[1].dim() == 2:
            return torch.ops.peakcut.spmm(parts.layout, parts.index_a, parts.index_b, parts.values, args[1],
                                          parts.rows, parts.cols, parts.transposed)
        if func in (torch.Tensor.t, torch.t) and parts is not None:
            return self._made(replace(parts, transposed=not parts.transposed))
        if func is torch.Tensor.coalesce and parts is not None:
            return first
        name = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
        raise CaptureError(f"{name} on a sparse matrix built in the step: {USE_INSTEAD}")

    def _made(self, parts: _Parts) -> torch.Tensor:
        """A stand-in for the sparse matrix of `parts`, outside the trace (on the meta device:
        FakeTensors cannot make a CSR tensor), remembered with its parts."""
        def meta(t: torch.Tensor) -> torch.Tensor:
            return torch.empty(t.shape, dtype=t.dtype, device="meta")

        rows, cols = (parts.cols, parts.rows) if parts.transposed else (parts.rows, parts.cols)
        with disable_proxy_modes_tracing(), unset_fake_temporarily(), torch._C.DisableTorchFunction():
            if parts.layout == "coo":
                made = torch.sparse_coo_tensor(meta(parts.index_a), meta(parts.values), (rows, cols))
            else:
                made = torch.sparse_csr_tensor(meta(parts.index_a), meta(parts.index_b), meta(parts.values),
                                               (rows, cols)) if not parts.transposed else \
                    torch.sparse_coo_tensor(torch.empty(2, parts.values.shape[0], dtype=torch.int64, device="meta"),
                                            meta(parts.values), (rows, cols))
        self._parts[id(made)] = (made, parts)
        return made


def traced_sparse(gm: torch.fx.GraphModule) -> bool:
    """Whether a traced step holds a sparse tensor (it is then traced again with SparseLowering,
    as it is when a plain trace fails)."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.layout != torch.strided:
            return True
    return False


class _SparseMetaFailures(logging.Filter):
    """Drops the FakeTensor log record of a sparse compressed tensor's failed meta kernel."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.args and any("sparse_compressed" in str(a) for a in record.args))


@contextlib.contextmanager
def quiet_sparse_meta_failures() -> Iterator[None]:
    """While a plain trace runs: FakeTensors cannot make a CSR tensor, and log the failure
    before it is raised; capture then traces again with SparseLowering, so that log is noise."""
    logger, quiet = logging.getLogger("torch._subclasses.fake_tensor"), _SparseMetaFailures()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
