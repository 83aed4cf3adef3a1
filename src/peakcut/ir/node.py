"""Operations of the IR: one ATen (or custom) op call with its tensor arguments."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor argument inside a node's args/kwargs (by tensor id)."""

    id: int


class Phase(str, Enum):
    """Which part of the training step a node belongs to."""

    FORWARD = "forward"
    LOSS = "loss"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


def iter_refs(value: Any) -> Iterator[TensorRef]:
    """All TensorRefs inside a nested args structure, in order."""
    if isinstance(value, TensorRef):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from iter_refs(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from iter_refs(v)


def map_refs(value: Any, fn: Any) -> Any:
    """Rebuild a nested args structure with fn(ref) in place of every TensorRef."""
    if isinstance(value, TensorRef):
        return fn(value)
    if isinstance(value, list):
        return [map_refs(v, fn) for v in value]
    if isinstance(value, tuple):
        return tuple(map_refs(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_refs(v, fn) for k, v in value.items()}
    return value


def resolve_op(name: str) -> torch._ops.OpOverload:
    """'aten.mm.default' -> torch.ops.aten.mm.default; clear error if it does not exist."""
    parts = name.split(".")
    if len(parts) != 3:
        raise ValueError(f"op name {name!r} is not of the form 'namespace.op.overload'")
    ns, op, overload = parts
    try:
        return getattr(getattr(getattr(torch.ops, ns), op), overload)
    except (AttributeError, RuntimeError) as e:
        raise ValueError(f"op {name!r} is not registered with PyTorch ({e})") from None


@dataclass(frozen=True, slots=True)
class Node:
    """One op call. Immutable: transformations replace nodes, never edit them.

    outputs: tensor ids of the op's results, None where the op returns None
    (e.g. convolution_backward with an output masked off). multi_output tells
    whether the op returns a tuple/list (even of length one).
    """

    id: int
    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outputs: tuple[int | None, ...]
    multi_output: bool = False
    module: str = ""
    phase: Phase = Phase.FORWARD
    name: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    _inputs: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # computed once: every analysis asks for a node's inputs, often many times
        seen: dict[int, None] = {}
        for ref in iter_refs(self.args):
            seen.setdefault(ref.id)
        for ref in iter_refs(self.kwargs):
            seen.setdefault(ref.id)
        object.__setattr__(self, "_inputs", tuple(seen))

    def input_ids(self) -> list[int]:
        """Tensor ids read by this node, in argument order, without repeats."""
        return list(self._inputs)

    def output_ids(self) -> list[int]:
        return [t for t in self.outputs if t is not None]

    def overload(self) -> torch._ops.OpOverload:
        return resolve_op(self.op)
