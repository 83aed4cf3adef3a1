"""A term as the ATen calls that compute it at real sizes: what a rewrite adds to a Graph for
a rule's destination, and what runs a rule's two sides on real tensors.

A call reads tensors by reference (an input's name, or the index of an earlier call) and
takes the op's other arguments after them (cat takes its two tensors as one list). Slices get
their real bounds from the sizes of the size terms.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from peakcut.taso.ops import Shape, dim_size, op
from peakcut.taso.term import Term, is_input, shape_of

Ref = str | int


@dataclass(frozen=True)
class Call:
    """One ATen call: `key` the vocabulary op, `aten` its ATen op, `refs` the tensors it
    reads, `extra` the arguments after them."""

    key: str
    aten: str
    refs: tuple[Ref, ...]
    extra: tuple[Any, ...]

    def args(self, value: Callable[[Ref], Any]) -> tuple[Any, ...]:
        """The call's positional arguments, each reference replaced by value(ref)."""
        tensors = [value(r) for r in self.refs]
        if self.key.startswith("cat"):
            return ([*tensors], *self.extra)
        return (*tensors, *self.extra)


def _extra(key: str, arg_shape: Shape, sizes: Mapping[str, int]) -> tuple[Any, ...]:
    params = op(key).params
    if key.startswith("cat"):
        return (params["dim"],)
    if key.startswith("slice"):
        dim = 0 if key.startswith("slice0") else 1
        cut = dim_size(arg_shape[dim][:1], sizes)
        return (dim, 0, cut) if key.endswith("a") else (dim, cut, dim_size(arg_shape[dim], sizes))
    if key.startswith("sum"):
        return (list(params["dim"]), True)  # type: ignore[call-overload]
    if key.startswith("softmax"):
        return (params["dim"], False)
    return ()


def calls(t: Term, inputs: Mapping[str, Shape], sizes: Mapping[str, int]) -> tuple[list[Call], Ref]:
    """The calls computing t (each op node once, arguments first) and the reference to its
    result; `sizes` the size of each size term of `inputs`' shapes."""
    out: list[Call] = []
    index: dict[Term, int] = {}
    memo: dict[Term, Shape | None] = {}

    def walk(x: Term) -> Ref:
        if is_input(x):
            return str(x[1])
        if x not in index:
            refs = tuple(walk(a) for a in x[1:])
            shape = shape_of(x[1], inputs, memo)
            if shape is None or shape_of(x, inputs, memo) is None:
                raise ValueError(f"term {x}: an op does not accept its arguments' shapes")
            out.append(Call(x[0], op(x[0]).aten, refs, _extra(x[0], shape, sizes)))
            index[x] = len(out) - 1
        return index[x]

    return out, walk(t)


def run(program: tuple[list[Call], Ref], tensors: Mapping[str, Any],
        resolve: Callable[[str], Callable[..., Any]]) -> Any:
    """The result of `program` (calls, result reference) on `tensors` (by input name);
    resolve(aten name) gives the callable of an ATen op (for torch: its OpOverload)."""
    made: list[Any] = []

    def value(r: Ref) -> Any:
        return made[r] if isinstance(r, int) else tensors[r]

    seq, root = program
    for c in seq:
        made.append(resolve(c.aten)(*c.args(value)))
    return value(root)
