"""The op vocabulary of the generator: ATen ops of captured graphs over 2-D tensors, each with
its arity, its shape function over symbolic shapes, its evaluation (on exact integers modulo a
prime for fingerprints, on exact symbolic values for the verifier) and its properties.

A symbolic shape is a pair of dims; a dim is a tuple of size terms ("m", "n", "k", or "1")
whose sizes add up, so a concatenation's dim remembers its parts (TASO's split tree) and a
slice takes the first part or the rest. Dims compare as multisets of terms.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

Dim = tuple[str, ...]
Shape = tuple[Dim, Dim]
Array = Any     # numpy array: int64 modulo the prime, or dtype=object of algebra.Value

ONE_DIM: Dim = ("1",)


def same_dim(a: Dim, b: Dim) -> bool:
    return sorted(a) == sorted(b)


def norm_shape(s: Shape) -> tuple[Dim, Dim]:
    """The shape with each dim's terms sorted: equal sizes for every binding of the terms."""
    return tuple(sorted(s[0])), tuple(sorted(s[1]))


def dim_size(d: Dim, binding: Mapping[str, int]) -> int:
    return sum(1 if t == "1" else binding[t] for t in d)


class Backend(Protocol):
    """How values are computed: arithmetic fix-up, element-wise functions and softmax."""

    def fix(self, x: Array) -> Array: ...
    def function(self, name: str, x: Array, idempotent: bool = False,
                 zero_fixed: bool = False) -> Array: ...
    def softmax(self, x: Array, dim: int) -> Array: ...


@dataclass(frozen=True)
class Op:
    """One op of the vocabulary: `key` names it in terms, `aten` and `params` as captured."""

    key: str
    aten: str
    arity: int
    shape: Callable[..., Shape | None]
    run: Callable[..., Array]           # run(backend, binding, shapes, *values)
    params: Mapping[str, object] = field(default_factory=dict)
    arithmetic: bool = True             # rounds in floating point (adds or multiplies)
    idempotent: bool = False            # op(op(x)) = op(x)
    zero_fixed: bool = False            # op(0) = 0, element-wise
    elementwise: bool = False


def _broadcast(a: Shape, b: Shape) -> Shape | None:
    out = []
    for da, db in zip(a, b, strict=True):
        if same_dim(da, db):
            out.append(da)
        elif da == ONE_DIM:
            out.append(db)
        elif db == ONE_DIM:
            out.append(da)
        else:
            return None
    return out[0], out[1]


def _unary(key: str, aten: str, fn: Callable[..., Array], arithmetic: bool,
           idempotent: bool = False, zero_fixed: bool = False) -> Op:
    return Op(key, aten, 1, lambda a: a, fn, arithmetic=arithmetic, idempotent=idempotent,
              zero_fixed=zero_fixed, elementwise=True)


def _binary(key: str, aten: str, fn: Callable[[Array, Array], Array]) -> Op:
    return Op(key, aten, 2, _broadcast,
              lambda be, bind, shapes, x, y: be.fix(fn(x, y)), elementwise=True)


def _mm_shape(a: Shape, b: Shape) -> Shape | None:
    return (a[0], b[1]) if same_dim(a[1], b[0]) else None


def _cat_shape(dim: int) -> Callable[[Shape, Shape], Shape | None]:
    def shape(a: Shape, b: Shape) -> Shape | None:
        other = 1 - dim
        if not same_dim(a[other], b[other]) or ONE_DIM in (a[dim], b[dim]):
            return None
        out = [a[0], a[1]]
        out[dim] = a[dim] + b[dim]
        return out[0], out[1]
    return shape


def _slice_shape(dim: int, part: int) -> Callable[[Shape], Shape | None]:
    def shape(a: Shape) -> Shape | None:
        if len(a[dim]) < 2:
            return None
        out = [a[0], a[1]]
        out[dim] = a[dim][:1] if part == 0 else a[dim][1:]
        return out[0], out[1]
    return shape


def _slice_run(dim: int, part: int) -> Callable[..., Array]:
    def run(be: Backend, bind: Mapping[str, int], shapes: list[Shape], x: Array) -> Array:
        cut = dim_size(shapes[0][dim][:1], bind)
        index = slice(0, cut) if part == 0 else slice(cut, None)
        return x[index, :] if dim == 0 else x[:, index]
    return run


def _sum_shape(dim: int) -> Callable[[Shape], Shape | None]:
    def shape(a: Shape) -> Shape | None:
        if a[dim] == ONE_DIM:
            return None
        out = [a[0], a[1]]
        out[dim] = ONE_DIM
        return out[0], out[1]
    return shape


def _softmax_shape(dim: int) -> Callable[[Shape], Shape | None]:
    return lambda a: None if a[dim] == ONE_DIM else a


def _cat_run(dim: int) -> Callable[..., Array]:
    return lambda be, bind, shapes, x, y: np.concatenate([x, y], axis=dim)


def _sum_run(dim: int) -> Callable[..., Array]:
    return lambda be, bind, shapes, x: be.fix(x.sum(axis=dim, keepdims=True))


def _softmax_run(dim: int) -> Callable[..., Array]:
    return lambda be, bind, shapes, x: be.softmax(x, dim)


def _slice_op(dim: int, part: int) -> Op:
    start = "0" if part == 0 else "first part"
    end = "first part" if part == 0 else "end"
    return Op(f"slice{dim}{'ab'[part]}", "aten.slice.Tensor", 1, _slice_shape(dim, part),
              _slice_run(dim, part), {"dim": dim, "start": start, "end": end},
              arithmetic=False)


def _make_ops() -> tuple[Op, ...]:
    def fn(name: str, idempotent: bool = False, zero_fixed: bool = False) -> Callable[..., Array]:
        return lambda be, bind, shapes, x: be.function(name, x, idempotent, zero_fixed)

    ops = [
        Op("mm", "aten.mm.default", 2, _mm_shape,
           lambda be, bind, shapes, x, y: be.fix(np.matmul(x, y))),
        _binary("add", "aten.add.Tensor", lambda x, y: x + y),
        _binary("sub", "aten.sub.Tensor", lambda x, y: x - y),
        _binary("mul", "aten.mul.Tensor", lambda x, y: x * y),
        *(Op(f"cat{d}", "aten.cat.default", 2, _cat_shape(d),
             _cat_run(d),
             {"dim": d}, arithmetic=False) for d in (0, 1)),
        _unary("neg", "aten.neg.default", lambda be, bind, shapes, x: be.fix(-x), False),
        _unary("relu", "aten.relu.default", fn("relu", True, True), False,
               idempotent=True, zero_fixed=True),
        _unary("gelu", "aten.gelu.default", fn("gelu", False, True), False, zero_fixed=True),
        Op("t", "aten.t.default", 1, lambda a: (a[1], a[0]),
           lambda be, bind, shapes, x: x.T.copy(), arithmetic=False),
        *(_slice_op(d, p) for d in (0, 1) for p in (0, 1)),
        *(Op(f"sum{d}", "aten.sum.dim_IntList", 1, _sum_shape(d),
             _sum_run(d),
             {"dim": [d], "keepdim": True}) for d in (0, 1)),
        *(Op(f"softmax{d}", "aten._softmax.default", 1, _softmax_shape(d),
             _softmax_run(d),
             {"dim": d, "half_to_float": False}) for d in (0, 1)),
    ]
    return tuple(ops)


OPS: tuple[Op, ...] = _make_ops()
BY_KEY: Mapping[str, Op] = {op.key: op for op in OPS}


def op(key: str) -> Op:
    """The op named `key`; a clear error for a name outside the vocabulary."""
    try:
        return BY_KEY[key]
    except KeyError:
        raise ValueError(f"op {key!r} is not in the vocabulary: {', '.join(BY_KEY)}") from None
