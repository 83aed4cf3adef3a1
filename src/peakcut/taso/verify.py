"""The verifier: a candidate substitution is proved by symbolic execution before it is used.

Both graphs run on tensors of symbolic elements at small shapes, in exact rational arithmetic
(algebra.Value); element-wise functions (ReLU, GELU, the exp inside softmax) are
uninterpreted functions, with the properties their ops declare (ReLU is idempotent). The two
outputs must have the same symbolic shape, and every element must be the same rational
function, at every binding of the size terms in `BINDINGS` (sizes that differ between terms
and between bindings, so a transpose or a dim mixed up does not pass by coincidence). A pair
that is not proved is dropped with its reason; nothing here is a float comparison.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from peakcut.taso.algebra import Atoms, Value, apply_function
from peakcut.taso.ops import Array, Shape, dim_size, norm_shape, op
from peakcut.taso.term import Term, evaluate, input_names, nodes, shape_of

# Sizes of the terms of the vocabulary's dims at which a substitution is checked.
BINDINGS: tuple[Mapping[str, int], ...] = ({"m": 2, "n": 3, "k": 4}, {"m": 3, "n": 1, "k": 2})


class Symbolic:
    """The verifier's backend: dtype=object arrays of algebra.Value over one atom table."""

    def __init__(self, atoms: Atoms) -> None:
        self.atoms = atoms

    def fix(self, x: Array) -> Array:
        return x

    def function(self, name: str, x: Array, idempotent: bool = False,
                 zero_fixed: bool = False) -> Array:
        out = np.empty(x.shape, dtype=object)
        for i in np.ndindex(x.shape):
            out[i] = apply_function(self.atoms, name, x[i], idempotent, zero_fixed)
        return out

    def softmax(self, x: Array, dim: int) -> Array:
        e = self.function("exp", x)
        total = e.sum(axis=dim, keepdims=True)
        return e / total


@dataclass(frozen=True)
class Verdict:
    """proved, or why not: `kind` (inputs, shapes, values) and the first difference found."""

    proved: bool
    reason: str = ""
    kind: str = ""


class _Run:
    """One binding's symbolic inputs and the values of the terms evaluated so far."""

    def __init__(self, inputs: Mapping[str, Shape], binding: Mapping[str, int]) -> None:
        self.atoms = Atoms()
        self.backend = Symbolic(self.atoms)
        self.binding = binding
        self.values: dict[str, Array] = {}
        for name, shape in sorted(inputs.items()):
            sizes = tuple(dim_size(d, binding) for d in shape)
            arr = np.empty(sizes, dtype=object)
            for i in np.ndindex(sizes):
                arr[i] = Value.atom(self.atoms.atom(("in", name, *i)))
            self.values[name] = arr
        self.memo: dict[Term, Array] = {}
        self.shapes: dict[Term, Shape | None] = {}


class Verifier:
    """Proves candidate substitutions over `inputs` (name -> symbolic shape)."""

    def __init__(self, inputs: Mapping[str, Shape],
                 bindings: Sequence[Mapping[str, int]] = BINDINGS) -> None:
        if len(bindings) < 2:
            raise ValueError(f"bindings: a substitution is checked at two shapes or more, got {len(bindings)}")
        self.inputs = dict(inputs)
        self._runs = [_Run(self.inputs, b) for b in bindings]
        self._shapes: dict[Term, Shape | None] = {}

    def prove(self, src: Term, dst: Term) -> Verdict:
        """Whether src and dst compute the same function, dst of no input src lacks (so src
        can be replaced by dst; the other way too when their inputs are the same)."""
        if not set(input_names(dst)) <= set(input_names(src)):
            return Verdict(False, kind="inputs",
                           reason=f"dst reads inputs src does not: {input_names(src)} vs {input_names(dst)}")
        s1, s2 = shape_of(src, self.inputs, self._shapes), shape_of(dst, self.inputs, self._shapes)
        if s1 is None or s2 is None:
            return Verdict(False, kind="shapes", reason="an op does not accept its arguments' shapes")
        if norm_shape(s1) != norm_shape(s2):
            return Verdict(False, kind="shapes", reason=f"output shapes differ: {s1} vs {s2}")
        for run in self._runs:
            a = evaluate(src, run.backend, run.binding, self.inputs, run.values, run.memo, run.shapes)
            b = evaluate(dst, run.backend, run.binding, self.inputs, run.values, run.memo, run.shapes)
            if a.shape != b.shape:
                return Verdict(False, kind="shapes", reason=f"at {dict(run.binding)} output sizes differ: {a.shape} vs {b.shape}")
            for i in np.ndindex(a.shape):
                if not a[i].same(b[i]):
                    return Verdict(False, kind="values", reason=f"at {dict(run.binding)} element {i} differs")
        return Verdict(True)


def float_exact(src: Term, dst: Term) -> bool:
    """Neither graph adds, multiplies or reduces (layout ops, negation and element-wise
    functions only): both compute each element by the same function of the same input
    element, so they agree bit for bit in floating point, not only over the reals."""
    return not any(op(n[0]).arithmetic for t in (src, dst) for n in nodes(t))
