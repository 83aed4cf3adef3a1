"""What a workspace rule sees of one op call (OpCall), and the small helpers the rules share."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch._prims_common

from peakcut.ir.registry import bind_arguments
from peakcut.memory.workspace.machine import CpuMachine

GRAIN_SIZE = 32768
"""at::internal::GRAIN_SIZE: below this many elements CPU kernels run serially."""


@dataclass(frozen=True)
class OpCall:
    """One op call: schema-bound arguments (tensors as meta tensors), outputs, the machine."""

    op: torch._ops.OpOverload
    args: Mapping[str, Any]
    outputs: tuple[torch.Tensor, ...]
    machine: CpuMachine

    @property
    def family(self) -> str:
        """The op's name without namespace and overload, e.g. 'convolution_backward'."""
        return str(self.op._schema.name.split("::")[-1])

    @property
    def overload(self) -> str:
        return str(self.op._overloadname)

    @property
    def threads(self) -> int:
        return self.machine.threads

    def tensor(self, name: str) -> torch.Tensor | None:
        value = self.args.get(name)
        return value if isinstance(value, torch.Tensor) else None

    def out(self, index: int = 0) -> torch.Tensor | None:
        return self.outputs[index] if index < len(self.outputs) else None


Rule = Callable[[OpCall], int]
"""A workspace rule: transient bytes of one call (beyond its outputs)."""


def bind(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Map positional and keyword arguments onto the schema's argument names (defaults filled)."""
    return bind_arguments(op._schema.arguments, args, kwargs)


def itemsize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def prod(xs: Iterable[int]) -> int:
    return math.prod(int(x) for x in xs)


def round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def alloc_peak(events: Iterable[int]) -> int:
    """Highest running sum of a sequence of signed allocation sizes."""
    run = peak = 0
    for b in events:
        run += b
        peak = max(peak, run)
    return peak


def is_reduced_float(dtype: torch.dtype) -> bool:
    return dtype in (torch.bfloat16, torch.float16)


def contiguous_copy(t: torch.Tensor | None) -> int:
    """Bytes of the copy `.contiguous()` makes of t (0 when it is contiguous or None)."""
    return 0 if t is None or t.is_contiguous() else nbytes(t)


def suggest_memory_format(t: torch.Tensor) -> torch.memory_format:
    """ATen ``Tensor::suggest_memory_format``: channels-last when the strides are channels-last-like."""
    return torch._prims_common.suggest_memory_format(t)
