"""Which tensors a step takes: the batch's leaves, the parameters and the buffers, checked
before anything is traced.

A captured step holds dense (strided) tensors of the dtypes the graph represents
(`peakcut.ir.tensor`). Everything else is refused by name and kind, never with an error
from deep inside the trace: sparse tensors (COO, CSR, CSC, BSR, BSC), nested tensors,
quantized tensors, DTensors, MKL-DNN tensors, other tensor subclasses (any `type(t)` but
`torch.Tensor` and `nn.Parameter`; FakeTensors are taken as they are), lazy modules'
uninitialized parameters, and dtypes such as float8. Complex tensors are taken in the
batch and as buffers or frozen parameters; a complex parameter that trains is refused
(the optimizers' complex arithmetic is not captured).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from peakcut.capture.errors import CaptureError
from peakcut.spec.fully_sharded import local_tensor
from peakcut.spec.tensor_kinds import batch_problem, unsupported_kind

_SUPPORTED = " (peakcut captures dense torch.Tensors and nn.Parameters of the usual dtypes)"


def _sparse_hint(problem: str) -> str:
    """What to do instead with a sparse COO or CSR matrix (capture.sparse)."""
    if "sparse COO" not in problem and "sparse CSR" not in problem:
        return ""
    return ("; give its index tensors and values instead and build the matrix in the step "
            "(torch.sparse_coo_tensor(indices, values, size) or torch.sparse_csr_tensor(crow, col, values, "
            "size)): its products with dense matrices (torch.sparse.mm) are captured (docs/gnn.md)")


def check_inputs(model: torch.nn.Module, batch: Any, trains: bool, sharded: bool = False) -> None:
    """Refuse, before tracing, a batch leaf that is not a tensor (TypeError) and a batch leaf,
    parameter or buffer of a kind a captured step cannot hold (CaptureError). `trains`: the
    step computes gradients (a loss_fn is given); `sharded`: the parameters are FSDP2's DTensors,
    whose local shards the step holds."""
    for i, (path, leaf) in enumerate(pytree.tree_flatten_with_path(batch)[0]):
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"batch leaf {i} (batch{pytree.keystr(path)}) is a {type(leaf).__name__}; "
                            "only tensors are supported")
    problem = batch_problem(batch)
    if problem is not None:
        raise CaptureError(f"{problem}, which a captured step cannot take{_SUPPORTED}{_sparse_hint(problem)}")
    for kind, items in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in items:
            what = unsupported_kind(local_tensor(t) if sharded else t)
            if what is None and kind == "parameter" and trains and t.requires_grad and t.is_complex():
                what = "a complex tensor that requires grad (complex training is not captured)"
            if what is not None:
                raise CaptureError(f"{kind} {name!r} of {type(model).__name__} is {what}, which a captured "
                                   f"step cannot hold{_SUPPORTED}")
