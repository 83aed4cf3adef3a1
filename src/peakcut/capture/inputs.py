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
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
from torch.utils import _pytree as pytree

from peakcut.capture.errors import CaptureError
from peakcut.ir.tensor import dtype_name

_LAYOUTS = {
    torch.sparse_coo: "a sparse COO tensor",
    torch.sparse_csr: "a sparse CSR tensor",
    torch.sparse_csc: "a sparse CSC tensor",
    torch.sparse_bsr: "a sparse BSR tensor",
    torch.sparse_bsc: "a sparse BSC tensor",
    torch._mkldnn: "an MKL-DNN tensor",  # type: ignore[attr-defined]
}

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SUPPORTED = " (peakcut captures dense torch.Tensors and nn.Parameters of the usual dtypes)"


def unsupported_kind(t: torch.Tensor) -> str | None:
    """What `t` is when a captured step cannot hold it ("a sparse COO tensor", "a nested
    tensor", "a tensor subclass MyTensor", ...), or None for a dense tensor it can."""
    cls = type(t)
    if isinstance(t, (UninitializedParameter, UninitializedBuffer)):
        return "an uninitialized parameter or buffer of a lazy module (run one forward before capturing)"
    if t.is_nested:
        return "a nested tensor"
    if any(c.__name__ == "DTensor" for c in cls.__mro__):
        return "a DTensor"
    if cls not in _PLAIN and not issubclass(cls, FakeTensor):
        return f"a tensor subclass {cls.__name__}"
    if t.layout in _LAYOUTS:
        return _LAYOUTS[t.layout]
    if t.layout != torch.strided:
        return f"a tensor of layout {t.layout}"
    if t.is_quantized:
        return "a quantized tensor"
    try:
        dtype_name(t.dtype)
    except ValueError:
        return f"a {str(t.dtype).removeprefix('torch.')} tensor (a dtype a captured step cannot hold)"
    return None


def batch_problem(batch: Any) -> str | None:
    """Why `batch` cannot be given to a captured step, naming the leaf by its pytree path
    ("batch[1] is a sparse COO tensor"), or None."""
    for path, leaf in pytree.tree_flatten_with_path(batch)[0]:
        kind = unsupported_kind(leaf) if isinstance(leaf, torch.Tensor) else None
        if kind is not None:
            return f"batch{pytree.keystr(path)} is {kind}"
    return None


def check_inputs(model: torch.nn.Module, batch: Any, trains: bool) -> None:
    """Refuse, before tracing, a batch leaf that is not a tensor (TypeError) and a batch leaf,
    parameter or buffer of a kind a captured step cannot hold (CaptureError). `trains`: the
    step computes gradients (a loss_fn is given)."""
    for i, (path, leaf) in enumerate(pytree.tree_flatten_with_path(batch)[0]):
        if not isinstance(leaf, torch.Tensor):
            raise TypeError(f"batch leaf {i} (batch{pytree.keystr(path)}) is a {type(leaf).__name__}; "
                            "only tensors are supported")
    problem = batch_problem(batch)
    if problem is not None:
        raise CaptureError(f"{problem}, which a captured step cannot take{_SUPPORTED}")
    for kind, items in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in items:
            what = unsupported_kind(t)
            if what is None and kind == "parameter" and trains and t.requires_grad and t.is_complex():
                what = "a complex tensor that requires grad (complex training is not captured)"
            if what is not None:
                raise CaptureError(f"{kind} {name!r} of {type(model).__name__} is {what}, which a captured "
                                   f"step cannot hold{_SUPPORTED}")
