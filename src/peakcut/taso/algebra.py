"""Exact symbolic scalars for the verifier: rational functions with rational coefficients over
atoms, where an atom is an input element or an element-wise function applied to a value (an
uninterpreted function: two applications are equal exactly when their arguments are).

A polynomial is kept in a canonical form (a sorted tuple of monomials with non-zero
coefficients), so two polynomials are equal as functions exactly when their forms are equal.
A rational function is a numerator and a denominator; two are equal when the cross products
are. Every equality this module reports holds over the reals (denominators non-zero); an
inequality only says that no proof was found.
"""

from __future__ import annotations

from fractions import Fraction

Monomial = tuple[tuple[int, int], ...]        # ((atom, power), ...) sorted by atom
PolyForm = tuple[tuple[Monomial, Fraction], ...]


class Atoms:
    """Interns atoms (input elements, function applications) to small integers, so that the
    values of one verification run share one numbering and compare by their forms."""

    def __init__(self) -> None:
        self._ids: dict[tuple[object, ...], int] = {}
        self.kinds: list[tuple[object, ...]] = []

    def atom(self, key: tuple[object, ...]) -> int:
        """The number of the atom `key`, made on first use."""
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self.kinds)
            self.kinds.append(key)
        return got


def _poly(terms: dict[Monomial, Fraction]) -> PolyForm:
    return tuple(sorted((m, c) for m, c in terms.items() if c != 0))


def _mono_mul(a: Monomial, b: Monomial) -> Monomial:
    powers = dict(a)
    for atom, p in b:
        powers[atom] = powers.get(atom, 0) + p
    return tuple(sorted(powers.items()))


def poly_add(a: PolyForm, b: PolyForm, sign: int = 1) -> PolyForm:
    terms = dict(a)
    for m, c in b:
        terms[m] = terms.get(m, Fraction(0)) + sign * c
    return _poly(terms)


def poly_mul(a: PolyForm, b: PolyForm) -> PolyForm:
    terms: dict[Monomial, Fraction] = {}
    for ma, ca in a:
        for mb, cb in b:
            m = _mono_mul(ma, mb)
            terms[m] = terms.get(m, Fraction(0)) + ca * cb
    return _poly(terms)


ONE: PolyForm = (((), Fraction(1)),)
ZERO: PolyForm = ()


class Value:
    """A rational function num / den over interned atoms, with exact arithmetic."""

    __slots__ = ("num", "den")

    def __init__(self, num: PolyForm, den: PolyForm = ONE) -> None:
        self.num = num
        self.den = den

    @staticmethod
    def atom(n: int) -> Value:
        mono: Monomial = ((n, 1),)
        return Value(((mono, Fraction(1)),))

    @staticmethod
    def const(c: int | Fraction) -> Value:
        return Value(_poly({(): Fraction(c)}))

    def __add__(self, other: Value) -> Value:
        if self.den == other.den:
            return Value(poly_add(self.num, other.num), self.den)
        return Value(poly_add(poly_mul(self.num, other.den), poly_mul(other.num, self.den)),
                     poly_mul(self.den, other.den))

    def __sub__(self, other: Value) -> Value:
        return self + (-other)

    def __neg__(self) -> Value:
        return Value(tuple((m, -c) for m, c in self.num), self.den)

    def __mul__(self, other: Value) -> Value:
        if other.den == ONE and self.den != ONE:
            return Value(poly_mul(self.num, other.num), self.den)
        return Value(poly_mul(self.num, other.num), poly_mul(self.den, other.den))

    def __truediv__(self, other: Value) -> Value:
        if not other.num:
            raise ZeroDivisionError("division by a value that is identically zero")
        return Value(poly_mul(self.num, other.den), poly_mul(self.den, other.num))

    def same(self, other: Value) -> bool:
        """Equal as functions over the reals (where both denominators are non-zero)."""
        if self.den == other.den:
            return self.num == other.num
        return poly_mul(self.num, other.den) == poly_mul(other.num, self.den)

    def key(self) -> tuple[PolyForm, PolyForm]:
        """A hashable form: equal keys mean equal values (not conversely for fractions)."""
        return self.num, self.den

    def single_atom(self) -> int | None:
        """The atom this value is (coefficient 1, power 1), or None."""
        if self.den == ONE and len(self.num) == 1:
            mono, coef = self.num[0]
            if coef == 1 and len(mono) == 1 and mono[0][1] == 1:
                return mono[0][0]
        return None


def apply_function(atoms: Atoms, name: str, x: Value, idempotent: bool = False,
                   zero_fixed: bool = False) -> Value:
    """name(x) for an uninterpreted element-wise function, with the properties its op
    declares: idempotent, f(f(x)) = f(x); zero_fixed, f(0) = 0."""
    if zero_fixed and not x.num:
        return x
    if idempotent:
        inner = x.single_atom()
        if inner is not None and atoms.kinds[inner][0] == name:
            return x
    return Value.atom(atoms.atom((name, x.key())))
