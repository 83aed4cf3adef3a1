"""Operations of the IR: one ATen (or custom) op call with its tensor arguments."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

import torch

from peakcut.ir.registry import OpKind, argument_names, lookup, mutated_arguments, resolve_op
from peakcut.ir.tags import NO_TAGS, NodeTags


@dataclass(frozen=True, slots=True)
class TensorRef:
    """A tensor argument inside a node's args/kwargs (by tensor id)."""

    id: int


class Hyper(float):
    """A run-time scalar argument (an optimizer hyper-parameter such as a group's lr).

    It is a float, with the value it had at capture, so analyses, cost models and
    FakeTensor re-runs treat it as the constant it was; generated programs read it
    by `name` from the `hp` mapping passed at every call (values: spec.scalars).
    """

    __slots__ = ("name",)
    name: str

    def __new__(cls, name: str, value: float) -> Hyper:
        obj = super().__new__(cls, value)
        obj.name = name
        return obj

    def __repr__(self) -> str:
        return f"Hyper({self.name!r}, {float(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Hyper, (self.name, float(self)))

    def __deepcopy__(self, memo: dict[int, Any]) -> Hyper:
        return self

    def __copy__(self) -> Hyper:
        return self


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


class _WeakReferable:
    """Lets a slotted dataclass be weakly referenced (peakcut.ir.node_cache), on Python 3.10 too."""

    __slots__ = ("__weakref__",)


@dataclass(frozen=True, slots=True)
class Node(_WeakReferable):
    """One op call. Immutable: transformations replace nodes, never edit them.

    outputs: tensor ids of the op's results, None where the op returns None
    (e.g. convolution_backward with an output masked off). multi_output tells
    whether the op returns a tuple/list (even of length one). tags: what the node carries
    between packages (peakcut.ir.tags: fission part, remat origin, swap pair, ...).

    Derived facts are computed once per node object (it never changes):
    input_tuple / output_tuple (what input_ids() / output_ids() return, as tuples,
    for hot loops that only read them) and the tensors it writes in place
    (mutated_ids). Values other modules compute for a node live in their own
    caches (peakcut.ir.node_cache.NodeCache), keyed by the node object and what
    else they read.
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
    tags: NodeTags = NO_TAGS
    input_tuple: tuple[int, ...] = field(init=False, repr=False, compare=False)
    output_tuple: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _mutated: tuple[int, ...] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # computed once: every analysis asks for a node's inputs, often many times
        seen: dict[int, None] = {}
        for ref in iter_refs(self.args):
            seen.setdefault(ref.id)
        for ref in iter_refs(self.kwargs):
            seen.setdefault(ref.id)
        object.__setattr__(self, "input_tuple", tuple(seen))
        object.__setattr__(self, "output_tuple", tuple(t for t in self.outputs if t is not None))
        try:
            mutated: tuple[int, ...] | None = _mutated_refs(self.op, self.args, self.kwargs)
        except Exception:
            mutated = None   # e.g. an op PyTorch does not know: mutated_ids() raises the error
        object.__setattr__(self, "_mutated", mutated)

    def __getstate__(self) -> tuple[Any, ...]:
        # pickles (and copies) hold what the node was built from; the derived facts and the
        # caches keyed by the node object hold nothing for the copy
        return tuple(getattr(self, f) for f in _INIT_FIELDS)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        for name, value in zip(_INIT_FIELDS, state, strict=True):
            object.__setattr__(self, name, value)
        self.__post_init__()

    def input_ids(self) -> list[int]:
        """Tensor ids read by this node, in argument order, without repeats."""
        return list(self.input_tuple)

    def output_ids(self) -> list[int]:
        """Tensor ids of the outputs that are not None, in order."""
        return list(self.output_tuple)

    def mutated_ids(self) -> tuple[int, ...]:
        """Input tensor ids the op writes in place (from its schema), in argument order.

        Positional arguments first, then keyword arguments; a tensor given twice
        appears twice. Computed with the node; raises ValueError for an op PyTorch
        does not know (like the registry's mutated_arguments).
        """
        written = self._mutated
        if written is None:
            written = _mutated_refs(self.op, self.args, self.kwargs)
            object.__setattr__(self, "_mutated", written)
        return written

    def overload(self) -> torch._ops.OpOverload:
        return resolve_op(self.op)

    def allocates(self) -> bool:
        """True when the node makes a new tensor: it has a result, writes no argument in place
        and is no view (run on the host, such an op writes into a buffer through its out=
        overload)."""
        info = lookup(self.op)
        return bool(self.output_tuple) and not self.mutated_ids() and (info is None or info.kind is not OpKind.VIEW)


_INIT_FIELDS = tuple(f.name for f in fields(Node) if f.init)


def _mutated_refs(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
    written = mutated_arguments(op)
    if not written:
        return ()
    out: list[int] = []
    for name, value in zip(argument_names(op), args, strict=False):
        if name in written:
            out.extend(r.id for r in iter_refs(value))
    for name, value in kwargs.items():
        if name in written:
            out.extend(r.id for r in iter_refs(value))
    return tuple(out)
