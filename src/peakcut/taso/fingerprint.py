"""Fingerprints: a term's output on seeded random inputs, in exact arithmetic modulo a prime
(TASO computes them on integers so that floating-point rounding never blurs equality).

Additions, products and sums are exact modulo the prime; a division is a product with the
modular inverse. ReLU keeps its meaning (the residues below half the prime are the positive
numbers); other element-wise functions (GELU, the exp inside softmax) are fixed keyed cubic
maps, stand-ins that two different graphs are unlikely to agree on by chance. Two terms with
equal fingerprints are a candidate substitution; only the verifier says it holds.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from peakcut.taso.ops import Array, Shape, dim_size, norm_shape, op
from peakcut.taso.term import Term, evaluate, shape_of

PRIME = 268435399               # the largest prime below 2**28: products stay below 2**63
_KEYS = {"gelu": (91815541, 7, 3), "exp": (2654435, 40503, 1)}

FingerprintKey = tuple[object, bytes]


def _cubic(x: Array, a: int, b: int, c: int) -> Array:
    sq = (x * x) % PRIME
    return ((sq * x % PRIME) * a + x * b + c) % PRIME


def _inverse(x: Array) -> Array:
    flat = [pow(int(v), PRIME - 2, PRIME) for v in x.ravel()]
    return np.array(flat, dtype=np.int64).reshape(x.shape)


class ModPrime:
    """The fingerprint backend: int64 arrays of residues modulo PRIME."""

    def fix(self, x: Array) -> Array:
        return np.asarray(x, dtype=np.int64) % PRIME

    def function(self, name: str, x: Array, idempotent: bool = False,
                 zero_fixed: bool = False) -> Array:
        if name == "relu":
            return np.where(x < PRIME // 2, x, 0)
        if name not in _KEYS:
            raise ValueError(f"no fingerprint map for element-wise function {name!r}")
        out = _cubic(x, *_KEYS[name])
        return np.where(x == 0, 0, out) if zero_fixed else out

    def softmax(self, x: Array, dim: int) -> Array:
        e = self.function("exp", x)
        return (e * _inverse(e.sum(axis=dim, keepdims=True) % PRIME)) % PRIME


class Fingerprinter:
    """Fingerprints of terms over `inputs` (name -> symbolic shape) at the sizes of `binding`,
    with input values drawn from `seed`. Values of terms are kept for reuse by larger terms."""

    def __init__(self, inputs: Mapping[str, Shape], binding: Mapping[str, int], seed: int) -> None:
        self.inputs = dict(inputs)
        self.binding = dict(binding)
        rng = np.random.default_rng(seed)
        self.values = {
            name: rng.integers(0, PRIME, size=tuple(dim_size(d, binding) for d in shape),
                               dtype=np.int64)
            for name, shape in sorted(self.inputs.items())}
        self.backend = ModPrime()
        self.memo: dict[Term, Array] = {}
        self.shapes: dict[Term, Shape | None] = {}

    def shape(self, t: Term) -> Shape | None:
        return shape_of(t, self.inputs, self.shapes)

    def key(self, t: Term, keep: bool = True) -> FingerprintKey | None:
        """(normalized shape, output bytes), or None when t's shapes do not fit its ops.
        keep=False computes t's own value without keeping it (its arguments are kept)."""
        s = self.shape(t)
        if s is None:
            return None
        if keep or t[0] == "in":
            value = evaluate(t, self.backend, self.binding, self.inputs, self.values, self.memo,
                             self.shapes)
        else:
            memo = self.memo
            args = [evaluate(a, self.backend, self.binding, self.inputs, self.values, memo,
                             self.shapes) for a in t[1:]]
            value = op(t[0]).run(self.backend, self.binding, [self.shape(a) for a in t[1:]],
                                 *args)
        return norm_shape(s), np.ascontiguousarray(value, dtype=np.int64).tobytes()
