"""TASO's pruning of redundant substitutions; every step keeps all optimization opportunities
(a pruned substitution follows from ones that stay, or from a more general valid one).

- Renaming: substitutions equal up to renaming inputs and the size terms of their shapes
  (and up to direction: a substitution is used both ways) share a key; one of each stays.
- implied_by_smaller: the two graphs have the same root op, and each pair of its arguments
  that differ is itself a valid substitution (a common sub-graph holding the outputs).
- implied_by_common: the two graphs hold a common op node on the same inputs; with that
  node replaced by a fresh input in both, the substitution still holds (more general).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from peakcut.taso.ops import Shape
from peakcut.taso.term import Term, inp, nodes, rename, replace, shape_of, text
from peakcut.taso.verify import Verifier

FRESH = "z"


def _first_inputs(t: Term, out: list[str]) -> list[str]:
    if t[0] == "in":
        if t[1] not in out:
            out.append(t[1])
    else:
        for a in t[1:]:
            _first_inputs(a, out)
    return out


class Renaming:
    """Keys of substitutions up to renaming their inputs and the size terms of the inputs'
    shapes (and up to direction: a substitution is used both ways)."""

    def __init__(self, inputs: Mapping[str, Shape]) -> None:
        self.inputs = dict(inputs)

    def _key(self, src: Term, dst: Term) -> tuple[str, str, str]:
        names = _first_inputs(dst, _first_inputs(src, []))
        mapping = {n: f"x{i}" for i, n in enumerate(names)}
        dims: dict[str, str] = {"1": "1"}
        shapes = []
        for n in names:
            shape = tuple(tuple(dims.setdefault(t, f"d{len(dims) - 1}") for t in d)
                          for d in self.inputs[n])
            shapes.append(str(shape))
        return text(rename(src, mapping)), text(rename(dst, mapping)), ";".join(shapes)

    def key(self, src: Term, dst: Term) -> tuple[str, str, str]:
        return min(self._key(src, dst), self._key(dst, src))


def implied_by_smaller(src: Term, dst: Term, prove: Callable[[Term, Term], bool]) -> str | None:
    """Why (src, dst) follows from smaller valid substitutions under a common root op, or
    None when it does not."""
    if src[0] == "in" or dst[0] == "in" or src[0] != dst[0]:
        return None
    pairs = [(a, b) for a, b in zip(src[1:], dst[1:], strict=True) if a != b]
    if pairs and all(prove(a, b) for a, b in pairs):
        return "same root op " + src[0] + ", arguments " + "; ".join(
            f"{text(a)} = {text(b)}" for a, b in pairs)
    return None


def implied_by_common(src: Term, dst: Term, inputs: Mapping[str, Shape]) -> str | None:
    """Why (src, dst) follows from a more general valid substitution with a common node of
    both replaced by a fresh input, or None."""
    if FRESH in inputs:
        raise ValueError(f"inputs: the name {FRESH!r} is kept for the fresh input of pruning")
    common = nodes(src) & nodes(dst)
    for node in sorted(common, key=text):
        shape = shape_of(node, inputs, {})
        if shape is None:
            continue
        z = inp(FRESH)
        s, d = replace(src, node, z), replace(dst, node, z)
        if Verifier({**inputs, FRESH: shape}).prove(s, d).proved:
            return f"{text(node)} as a fresh input: {text(s)} = {text(d)}"
    return None
