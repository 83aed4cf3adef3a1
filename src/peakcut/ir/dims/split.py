"""Running one node in parts: the part's arguments, and merging the part results.

    rule = dim_rule(g, nid)
    parts = [split_node_args(g, nid, rule, "b", 2, p).run(tensors) for p in range(2)]
    outputs = merge_outputs(rule, "b", parts)      # == running the node whole

A PartCall is plain data (which inputs to narrow, and the part's args/kwargs
with TensorRefs left in place), so code generation can emit it as source as
well as run it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, NamedTuple

import torch

from peakcut.ir.dims.call import schema_arguments
from peakcut.ir.dims.rule import CAT, SAME, DimRule, Label
from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef, map_refs
from peakcut.ir.node_cache import NodeCache
from peakcut.ir.registry import resolve_op

_NLL_SUM = 2  # at::Reduction::Sum

# Read-only arguments some kernels need contiguous (CPU, torch 2.13): native_layer_norm_backward
# indexes mean/rstd as flat arrays whatever their strides (wrong results, no error); the group
# norm kernels refuse strided inputs.
_CONTIGUOUS_ARGS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "aten.native_layer_norm_backward.default": ("mean", "rstd"),
    "aten.native_group_norm.default": ("input",),
    "aten.native_group_norm_backward.default": ("grad_out", "input", "mean", "rstd"),
})


class Narrow(NamedTuple):
    """The slice of one input a part reads: ``tensor.narrow(dim, start, length)``."""

    dim: int
    start: int
    length: int


@dataclass(frozen=True)
class PartCall:
    """One part of a split node.

    narrows: tensor id -> Narrow (dim, start, length): the part reads
    ``tensor.narrow(dim, start, length)`` (a view: in-place writes reach the
    whole tensor); other inputs are read whole. contiguous: narrowed inputs the
    op reads wrongly when strided (a kernel quirk): the part reads
    ``.contiguous()`` copies of them (only ever read-only inputs).
    args/kwargs: the node's, with size arguments divided and TensorRefs still in place.
    """

    op: str  # the node's op (squeeze.default runs as squeeze.dims)
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    narrows: Mapping[int, Narrow]
    contiguous: frozenset[int] = frozenset()

    def bind(self, tensors: Mapping[int, torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The part's concrete (args, kwargs), given the node's whole input tensors by id."""

        def part(ref: TensorRef) -> torch.Tensor:
            t = tensors[ref.id]
            cut = self.narrows.get(ref.id)
            if cut is None:
                return t
            t = t.narrow(*cut)
            return t.contiguous() if ref.id in self.contiguous else t

        return map_refs(self.args, part), map_refs(dict(self.kwargs), part)

    def run(self, tensors: Mapping[int, torch.Tensor]) -> tuple[torch.Tensor | None, ...]:
        """Run the part on the node's whole input tensors; results as a tuple (one per output)."""
        args, kwargs = self.bind(tensors)
        return as_outputs(resolve_op(self.op)(*args, **kwargs))


def as_outputs(result: Any) -> tuple[torch.Tensor | None, ...]:
    """An op's result as a tuple with one entry per node output."""
    if result is None:
        return ()
    if isinstance(result, torch.Tensor):
        return (result,)
    return tuple(result)


def label_sizes(g: Graph, nid: int, rule: DimRule) -> dict[Label, set[int]]:
    """Every length that carries each label: tensor dimensions and size-argument entries.

    A split by n is valid iff n divides all of them (they differ only where a
    reshape links a dimension to a merged one, e.g. B and B*T).
    """
    node = g.nodes[nid]
    sizes: dict[Label, set[int]] = {d: set() for d in rule.labels()}
    tensors = [*node.input_ids(), *node.outputs]
    for t, dims in zip(tensors, (*rule.inputs, *rule.outputs), strict=True):
        shape = () if t is None else g.tensors[t].shape
        if len(shape) != len(dims):
            raise ValueError(f"{node.op}: labels {dims} do not fit tensor {t} of shape {shape}")
        for d, s in zip(dims, shape, strict=True):
            if d is not None:
                sizes[d].add(s)
    for name, dims in rule.args.items():
        value = _get_arg(node.op, node.args, node.kwargs, name)
        for d, s in zip(dims, _entries(value), strict=True):
            if d is not None:
                sizes[d].add(s)
    return sizes


_LENGTHS: NodeCache[Mapping[Label, int]] = NodeCache()
"""node -> label_lengths, depending on (metas of the node's inputs and outputs, the rule)."""


def label_lengths(g: Graph, nid: int, rule: DimRule) -> Mapping[Label, int]:
    """Per label of `rule`, the gcd of label_sizes (0 for a label that carries no length).

    A split by n > 1 is valid iff n divides a length that is not 0. Read-only. Cached per node object, like
    dim_rule: reused while the rule is the same and the graph holds equal metas for
    the node's tensors (label_sizes reads nothing else from the graph).
    """
    node = g.nodes[nid]
    tensors = g.tensors
    metas = tuple([tensors[t] for t in node.input_tuple] + [tensors[t] for t in node.output_tuple])
    depends = (metas, rule)
    cached = _LENGTHS.get(node, depends)
    if cached is not None:
        return cached
    lengths = MappingProxyType({label: math.gcd(*sizes) if sizes else 0
                                for label, sizes in label_sizes(g, nid, rule).items()})
    _LENGTHS.put(node, lengths, depends)
    return lengths


def can_split(g: Graph, nid: int, rule: DimRule, label: Label, n: int) -> bool:
    """Whether `label` of node `nid` splits into `n` equal parts."""
    sizes = label_sizes(g, nid, rule).get(label)
    if not sizes:
        return False
    return n >= 1 and all(s % n == 0 for s in sizes)


def split_node_args(g: Graph, nid: int, rule: DimRule, label: Label, n: int, part: int) -> PartCall:
    """Part `part` of `n` of node `nid` split along `label` (see PartCall)."""
    if not 0 <= part < n:
        raise ValueError(f"part {part} is not in [0, {n})")
    if not can_split(g, nid, rule, label, n):
        raise ValueError(f"{label!r} of node {nid} does not split into {n} equal parts")
    node = g.nodes[nid]
    narrows: dict[int, Narrow] = {}
    for t, dims in zip(node.input_ids(), rule.inputs, strict=True):
        if label in dims:
            dim = dims.index(label)
            length = g.tensors[t].shape[dim] // n
            narrows[t] = Narrow(dim, part * length, length)
    args, kwargs = list(node.args), dict(node.kwargs)
    for name, dims in rule.args.items():
        value = _get_arg(node.op, args, kwargs, name)
        entries = [s // n if d == label else s for d, s in zip(dims, _entries(value), strict=True)]
        _set_arg(node.op, args, kwargs, name,
                 entries if isinstance(value, (list, tuple)) else entries[0])
    if rule.merge.get(label) == "nll_mean":
        _set_arg(node.op, args, kwargs, "reduction", _NLL_SUM)
    op = node.op
    if op == "aten.squeeze.default":  # a part's length-1 slice must not be squeezed too
        shape = g.tensors[node.input_ids()[0]].shape
        op, args = "aten.squeeze.dims", [args[0], [i for i, s in enumerate(shape) if s == 1]]
    quirky = {_get_arg(node.op, node.args, node.kwargs, name)
              for name in _CONTIGUOUS_ARGS.get(node.op, ())}
    contiguous = frozenset(t for t in narrows if TensorRef(t) in quirky)
    return PartCall(op, tuple(args), MappingProxyType(kwargs), MappingProxyType(narrows),
                    contiguous)


def part_rule(rule: DimRule, label: Label) -> DimRule:
    """The rule of a part's copy of a node split along `label` by split_node_args: a mean
    nll_loss split along a merged label runs as a sum (reduction=sum), so its copy merges
    as one when a region nested inside the part splits it again."""
    if rule.merge.get(label) != "nll_mean":
        return rule
    return replace(rule, merge=MappingProxyType(
        {k: "sum" if kind == "nll_mean" else kind for k, kind in rule.merge.items()}))


def merge_outputs(
    rule: DimRule, label: Label, parts: Sequence[Sequence[torch.Tensor | None]]
) -> tuple[torch.Tensor | None, ...]:
    """The node's outputs from its parts' outputs (see DimRule.combine)."""
    how = rule.combine(label)
    merged: list[torch.Tensor | None] = []
    for j, kind in enumerate(how):
        values = [p[j] for p in parts]
        tensors = [v for v in values if v is not None]
        if len(tensors) < len(values):
            merged.append(None)
        elif kind == CAT:
            merged.append(torch.cat(tensors, rule.outputs[j].index(label)))
        elif kind == SAME:
            merged.append(tensors[0])
        elif kind == "nll_mean":
            merged.append(_nll_mean(j, parts))
        else:
            merged.append(_reduce(kind, tensors))
    return tuple(merged)


def _reduce(kind: str, values: list[torch.Tensor]) -> torch.Tensor:
    stacked = torch.stack(values)
    if kind == "sum":
        return stacked.sum(0)
    if kind == "mean":
        return stacked.sum(0) / len(values)
    if kind == "amax":
        return stacked.amax(0)
    if kind == "amin":
        return stacked.amin(0)
    if kind == "prod":
        return stacked.prod(0)
    if kind == "any":
        return stacked.any(0)
    if kind == "all":
        return stacked.all(0)
    if kind == "logsumexp":
        return stacked.logsumexp(0)
    raise ValueError(f"unknown merge kind {kind!r}")


def _nll_mean(j: int, parts: Sequence[Sequence[torch.Tensor | None]]) -> torch.Tensor:
    """(output, total_weight) of a mean nll_loss from parts run with reduction=sum."""
    total = torch.stack(_tensors([p[1] for p in parts])).sum(0)
    if j == 1:
        return total
    return torch.stack(_tensors([p[0] for p in parts])).sum(0) / total


def _tensors(values: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """`values`, which must all be tensors (a part that returned None cannot be merged)."""
    tensors = [v for v in values if v is not None]
    if len(tensors) < len(values):
        raise ValueError("a part returned None where the merge needs a tensor")
    return tensors


def _entries(value: Any) -> list[int]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _position(op: str, name: str) -> tuple[int, bool]:
    for i, a in enumerate(schema_arguments(op)):
        if a.name == name:
            return i, a.kwarg_only
    raise ValueError(f"{op} has no argument {name!r}")


def _get_arg(op: str, args: Sequence[Any], kwargs: Mapping[str, Any], name: str) -> Any:
    i, kwarg_only = _position(op, name)
    if not kwarg_only and i < len(args):
        return args[i]
    if name in kwargs:
        return kwargs[name]
    return schema_arguments(op)[i].default_value


def _set_arg(op: str, args: list[Any], kwargs: dict[str, Any], name: str, value: Any) -> None:
    i, kwarg_only = _position(op, name)
    if not kwarg_only and i < len(args):
        args[i] = value
    else:
        kwargs[name] = value
