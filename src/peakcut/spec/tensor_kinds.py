"""Which tensors a captured step can hold, and why a batch cannot be given to one.

A captured step holds dense (strided) tensors of the dtypes the graph represents
(`peakcut.ir.tensor`): not sparse, nested, quantized, MKL-DNN or DTensor tensors, other
tensor subclasses, lazy modules' uninitialized parameters, or dtypes such as float8. Capture
refuses them before tracing (capture.inputs); a step refuses such a batch at every call.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.nn.parameter import UninitializedBuffer, UninitializedParameter
from torch.utils import _pytree as pytree

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
