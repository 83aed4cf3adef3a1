"""Terms: a single-output graph of vocabulary ops over named inputs, as a nested tuple that
is its own canonical form (a shared sub-graph is one node, so a term is a DAG).

An input is ("in", name); an op node is (op key, *argument terms). Shapes, evaluation, the
text form ("mm(a, t(c))") and its parser all read terms through this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peakcut.taso.ops import Array, Backend, Shape, op

Term = tuple[Any, ...]


def inp(name: str) -> Term:
    return ("in", name)


def is_input(t: Term) -> bool:
    return t[0] == "in"


def nodes(t: Term, out: set[Term] | None = None) -> set[Term]:
    """The op nodes of t (its distinct non-input sub-terms, t included)."""
    out = set() if out is None else out
    if not is_input(t) and t not in out:
        out.add(t)
        for a in t[1:]:
            nodes(a, out)
    return out


def size(t: Term) -> int:
    return len(nodes(t))


def input_names(t: Term) -> tuple[str, ...]:
    if is_input(t):
        return (t[1],)
    return tuple(sorted({n for a in t[1:] for n in input_names(a)}))


def ops_of(t: Term) -> list[str]:
    return sorted(n[0] for n in nodes(t))


def text(t: Term) -> str:
    if is_input(t):
        return str(t[1])
    return f"{t[0]}({', '.join(text(a) for a in t[1:])})"


def rename(t: Term, mapping: Mapping[str, str]) -> Term:
    if is_input(t):
        return inp(mapping.get(t[1], t[1]))
    return (t[0], *(rename(a, mapping) for a in t[1:]))


def replace(t: Term, old: Term, new: Term) -> Term:
    if t == old:
        return new
    if is_input(t):
        return t
    return (t[0], *(replace(a, old, new) for a in t[1:]))


def shape_of(t: Term, inputs: Mapping[str, Shape], memo: dict[Term, Shape | None]) -> Shape | None:
    """t's symbolic shape, or None when an op does not accept its arguments' shapes."""
    if is_input(t):
        if t[1] not in inputs:
            raise ValueError(f"term input {t[1]!r} has no shape in inputs {sorted(inputs)}")
        return inputs[t[1]]
    if t in memo:
        return memo[t]
    args = [shape_of(a, inputs, memo) for a in t[1:]]
    o = op(t[0])
    got = None if any(a is None for a in args) or len(args) != o.arity else o.shape(*args)
    memo[t] = got
    return got


def evaluate(t: Term, backend: Backend, binding: Mapping[str, int], inputs: Mapping[str, Shape],
             values: Mapping[str, Array], memo: dict[Term, Array],
             shape_memo: dict[Term, Shape | None] | None = None) -> Array:
    """t's value under `backend`, with the inputs' `values` at the sizes of `binding`."""
    if is_input(t):
        return values[t[1]]
    got = memo.get(t)
    if got is None:
        shape_memo = {} if shape_memo is None else shape_memo
        args = [evaluate(a, backend, binding, inputs, values, memo, shape_memo) for a in t[1:]]
        shapes = [shape_of(a, inputs, shape_memo) for a in t[1:]]
        got = memo[t] = op(t[0]).run(backend, binding, shapes, *args)
    return got


def parse(source: str) -> Term:
    """The term of its text ("mm(a, t(c))"); a clear error naming the text otherwise."""
    pos = 0

    def name() -> str:
        nonlocal pos
        start = pos
        while pos < len(source) and (source[pos].isalnum() or source[pos] == "_"):
            pos += 1
        if start == pos:
            raise ValueError(f"term {source!r}: a name expected at {pos}")
        return source[start:pos]

    def term() -> Term:
        nonlocal pos
        head = name()
        if pos < len(source) and source[pos] == "(":
            pos += 1
            args = [term()]
            while source.startswith(", ", pos):
                pos += 2
                args.append(term())
            if not source.startswith(")", pos):
                raise ValueError(f"term {source!r}: ')' expected at {pos}")
            pos += 1
            o = op(head)
            if len(args) != o.arity:
                raise ValueError(f"term {source!r}: {head} takes {o.arity} arguments, got {len(args)}")
            return (head, *args)
        return inp(head)

    got = term()
    if pos != len(source):
        raise ValueError(f"term {source!r}: unexpected text at {pos}")
    return got
