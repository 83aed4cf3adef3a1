"""What the per-family rule builders see of a node, what they return, and how that
becomes a DimRule.

A builder gets a :class:`Call` (the node's arguments by schema name, with
shapes and dtypes of its tensors) and returns a :class:`Labeling` that labels
tensor *arguments by name*. :func:`assemble` turns that into a DimRule over
the node's input ids and applies the checks every rule must pass whatever the
op: a tensor read in two places with different labels loses them, an input
the node writes in place must carry every label (a shared tensor would be
written n times), and labels that some dimension shorter than 2 carries go away
(no split count n > 1 divides it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import Any

import torch

from peakcut.ir.dims.rule import DimRule, Dims, Label
from peakcut.ir.dims.shapes import Shape
from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.ir.registry import bind_arguments, resolve_op


def aten(name: str) -> str:
    """'mm' -> 'aten.mm.default'; 'add.Tensor' -> 'aten.add.Tensor' (the registry's spelling)."""
    return f"aten.{name}" if "." in name else f"aten.{name}.default"


@cache
def schema_arguments(op: str) -> tuple[torch.Argument, ...]:
    """The op's schema arguments (name, kwarg_only, default_value, ...)."""
    return tuple(resolve_op(op)._schema.arguments)


def argument_values(op: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every schema argument by name: given positionally, by keyword, or its default."""
    return bind_arguments(schema_arguments(op), args, kwargs)


@dataclass(frozen=True)
class Call:
    """One node as rule builders see it.

    args: every schema argument by name (defaults filled in; tensors as TensorRef).
    shapes/dtypes: of every tensor the node reads or writes, by tensor id.
    outputs: the output shapes, None where the op returns None.
    """

    op: str
    args: Mapping[str, Any]
    shapes: Mapping[int, Shape]
    dtypes: Mapping[int, torch.dtype]
    outputs: tuple[Shape | None, ...]

    @staticmethod
    def of(g: Graph, nid: int) -> Call:
        node = g.nodes[nid]
        ids = [*node.input_ids(), *node.output_ids()]
        return Call(
            op=node.op,
            args=MappingProxyType(argument_values(node.op, node.args, node.kwargs)),
            shapes=MappingProxyType({t: g.tensors[t].shape for t in ids}),
            dtypes=MappingProxyType({t: g.tensors[t].torch_dtype for t in ids}),
            outputs=tuple(None if t is None else g.tensors[t].shape for t in node.outputs),
        )

    def arg(self, name: str) -> Any:
        return self.args[name]

    def shape(self, name: str) -> Shape:
        """Shape of the tensor argument `name`, which the op requires (ValueError if absent)."""
        shape = self.optional_shape(name)
        if shape is None:
            raise ValueError(f"{self.op}: argument {name!r} is not a tensor")
        return shape

    def optional_shape(self, name: str) -> Shape | None:
        """Shape of the tensor argument `name`, None if it is absent (an optional None)."""
        value = self.args.get(name)
        return self.shapes[value.id] if isinstance(value, TensorRef) else None

    def dtype(self, name: str) -> torch.dtype | None:
        value = self.args.get(name)
        return self.dtypes[value.id] if isinstance(value, TensorRef) else None

    def list_shapes(self, name: str) -> list[Shape | None]:
        """Shapes of a Tensor[] / Tensor?[] argument (None for None entries)."""
        return [self.shapes[v.id] if isinstance(v, TensorRef) else None for v in self.args[name]]

    @property
    def out(self) -> Shape:
        """The first output's shape (ops with one tensor result)."""
        shape = self.outputs[0]
        if shape is None:
            raise ValueError(f"{self.op}: first output is None")
        return shape


TensorLabels = Dims | list[Dims | None] | None
"""Labels of one tensor argument: one per dimension, a list with an entry per tensor of a
Tensor[] argument, or None (shared: every dimension None, as for an entry that is None)."""


@dataclass(frozen=True)
class Labeling:
    """A builder's answer: labels of tensor arguments by schema name.

    tensors: argument name -> labels (see TensorLabels); tensor arguments not
    named are shared (all None).
    outputs: labels per output (ignored for outputs that are None; None: all None).
    sizes: size-like arguments by name (see DimRule.args). merge: see DimRule.merge.
    """

    tensors: Mapping[str, TensorLabels]
    outputs: Sequence[Dims | None]
    sizes: Mapping[str, Dims] = field(default_factory=dict)
    merge: Mapping[Label, str] = field(default_factory=dict)


Builder = Callable[[Call], Labeling | None]


def assemble(call: Call, input_ids: Sequence[int], written: Sequence[int],
             labeling: Labeling) -> DimRule:
    """The DimRule of a node from its builder's labeling, with the generic checks applied."""
    seen: dict[int, list[Dims]] = {t: [] for t in input_ids}
    for name, value in call.args.items():
        given = labeling.tensors.get(name)
        if isinstance(value, TensorRef):
            seen[value.id].append(_fit(given, call.shapes[value.id], name))
        elif isinstance(value, (list, tuple)) and any(isinstance(v, TensorRef) for v in value):
            entries = given if isinstance(given, list) else [None] * len(value)
            for v, dims in zip(value, entries, strict=True):
                if isinstance(v, TensorRef):
                    seen[v.id].append(_fit(dims, call.shapes[v.id], name))
    outputs = []
    for shape, dims in zip(call.outputs, labeling.outputs, strict=True):
        outputs.append(() if shape is None else _fit(dims, shape, "output"))
    conflicting: set[Label] = set()
    inputs = []
    for t in input_ids:
        variants = seen[t]
        first = variants[0]
        for other in variants[1:]:
            conflicting |= {d for a, b in zip(first, other, strict=True) if a != b
                            for d in (a, b) if d is not None}
        inputs.append(first)
    sizes = {k: tuple(v) for k, v in labeling.sizes.items()}
    tensors = list(zip((*inputs, *outputs),
                       [*(call.shapes[t] for t in input_ids), *(s or () for s in call.outputs)],
                       strict=True))
    everything = {d for dims, _ in tensors for d in dims if d is not None}
    drop = conflicting | _unsplittable(tensors, sizes, call)
    for t in written:
        drop |= everything - set(inputs[list(input_ids).index(t)])
    return DimRule(
        inputs=tuple(_strip(d, drop) for d in inputs),
        outputs=tuple(_strip(d, drop) for d in outputs),
        args=MappingProxyType({k: _strip(v, drop) for k, v in sizes.items()}),
        merge=MappingProxyType({k: v for k, v in labeling.merge.items()
                                if k in everything and k not in drop}),
    )


def _strip(dims: Dims, drop: set[Label]) -> Dims:
    return tuple(None if d in drop else d for d in dims)


def _fit(dims: TensorLabels, shape: Shape, what: str) -> Dims:
    if dims is None:
        return (None,) * len(shape)
    if isinstance(dims, list) or len(dims) != len(shape):
        raise ValueError(f"labels {dims} do not fit {what} of shape {shape}")
    return tuple(dims)


def _unsplittable(tensors: list[tuple[Dims, Shape]], sizes: Mapping[str, Dims],
                  call: Call) -> set[Label]:
    """Labels carried by some dimension or size entry shorter than 2: no n > 1 divides it."""
    short: set[Label] = set()
    for dims, shape in tensors:
        short |= {d for d, s in zip(dims, shape, strict=True) if d is not None and s < 2}
    for name, dims in sizes.items():
        value = call.args[name]
        entries = value if isinstance(value, (list, tuple)) else [value]
        short |= {d for d, s in zip(dims, entries, strict=True) if d is not None and s < 2}
    return short
