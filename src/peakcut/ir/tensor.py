"""Tensors of the IR: metadata only (shape, dtype, storage), never data."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16,
        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
        torch.complex64, torch.complex128,
    )
}


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32; raises for dtypes the IR does not know."""
    name = str(dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype}")
    return name


def dtype_from_name(name: str) -> torch.dtype:
    """Inverse of dtype_name."""
    try:
        return _DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype name {name!r}; known: {sorted(_DTYPES)}") from None


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """The strides of a row-major (contiguous) tensor of `shape`, in elements."""
    strides: list[int] = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


class Role(str, Enum):
    """What a tensor is to the training step. Caller-held roles live for the whole step."""

    INPUT = "input"          # a batch tensor given by the caller
    PARAM = "param"          # a model parameter (updated in place by the optimizer)
    BUFFER = "buffer"        # a model buffer (BatchNorm statistics may be updated in place)
    OPT_STATE = "opt_state"  # optimizer state (momentum, Adam moments, step count)
    GRAD = "grad"            # the gradient of a parameter
    ACCUMULATED = "accumulated"  # p.grad of earlier micro-batches (accumulate=k), added to in place
    ACTIVATION = "activation"  # anything else computed during the step

    @property
    def caller_held(self) -> bool:
        return self in (Role.INPUT, Role.PARAM, Role.BUFFER, Role.OPT_STATE, Role.ACCUMULATED)


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """One tensor value: its layout and the storage it lives in.

    Views share the storage id of their base; memory is counted per storage
    (see Graph.storages), never per tensor.
    """

    id: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str
    storage: int
    storage_offset: int
    role: Role
    name: str = ""

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def itemsize(self) -> int:
        return dtype_from_name(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's elements (not of its storage)."""
        return self.numel * self.itemsize

    @property
    def torch_dtype(self) -> torch.dtype:
        return dtype_from_name(self.dtype)

    def to_meta(self) -> torch.Tensor:
        """An empty meta-device tensor with this layout, for shape and cost rules."""
        return torch.empty_strided(self.shape, self.stride, dtype=self.torch_dtype, device="meta")
