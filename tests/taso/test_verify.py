"""The verifier proves true substitutions and rejects false ones, each for its reason."""

from __future__ import annotations

import pytest

from peakcut.taso.term import parse
from peakcut.taso.verify import Verifier, float_exact

# a, b: m x n; c: n x k; x, y, z: square n x n (so a wrong transpose or order still type-checks)
INPUTS = {"a": (("m",), ("n",)), "b": (("m",), ("n",)), "c": (("n",), ("k",)),
          "x": (("n",), ("n",)), "y": (("n",), ("n",)), "z": (("n",), ("n",))}

FALSE = {
    "matmul commuted": ("mm(x, y)", "mm(y, x)"),
    "ReLU distributed over a sum": ("relu(add(a, b))", "add(relu(a), relu(b))"),
    "a concatenation's parts swapped": ("cat0(a, b)", "cat0(b, a)"),
    "a transpose dropped": ("mm(t(x), y)", "mm(x, y)"),
    "a transpose dropped (shapes)": ("t(mm(a, c))", "mm(a, c)"),
    "a reduction over the wrong dimension": ("sum0(t(x))", "t(sum0(x))"),
    "a reduction over the wrong dimension (shapes)": ("sum0(t(a))", "t(sum0(a))"),
    "a softmax over a slice": ("softmax1(slice1a(cat1(x, y)))", "slice1a(softmax1(cat1(x, y)))"),
    "equal at the fingerprint's shape only": ("sum1(sub(sum1(c), c))",
                               "add(add(sum1(c), sum1(c)), add(sum1(c), sum1(c)))"),
    "GELU is not idempotent": ("gelu(gelu(a))", "gelu(a)"),
    "dst reads an input src lacks": ("a", "slice0a(cat0(a, b))"),
}

TRUE = {
    "matmul associates": ("mm(mm(x, y), z)", "mm(x, mm(y, z))"),
    "transpose of a matmul": ("t(mm(a, c))", "mm(t(c), t(a))"),
    "ReLU is idempotent": ("relu(relu(a))", "relu(a)"),
    "a slice of a concatenation": ("slice0a(cat0(a, b))", "a"),
    "matmul over a concatenation": ("mm(cat0(a, b), c)", "cat0(mm(a, c), mm(b, c))"),
    "matmul distributes over a sum": ("add(mm(a, c), mm(b, c))", "mm(add(a, b), c)"),
    "softmax rows sum to one": ("mm(a, sum1(softmax1(c)))", "sum1(a)"),
    "softmax over a slice of the other dim": ("softmax1(slice0a(cat0(x, y)))",
                                              "slice0a(softmax1(cat0(x, y)))"),
    "softmax of a transpose": ("softmax1(t(a))", "t(softmax0(a))"),
    "a sum over a concatenation": ("sum0(cat1(a, b))", "cat1(sum0(a), sum0(b))"),
    "GELU of a transpose": ("gelu(t(a))", "t(gelu(a))"),
}


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    return Verifier(INPUTS)


@pytest.mark.parametrize("name", sorted(FALSE))
def test_false_candidates_are_rejected(verifier: Verifier, name: str) -> None:
    src, dst = FALSE[name]
    verdict = verifier.prove(parse(src), parse(dst))
    assert not verdict.proved, f"{name}: {src} => {dst} was proved"
    assert verdict.reason and verdict.kind in ("inputs", "shapes", "values")


@pytest.mark.parametrize("name", sorted(TRUE))
def test_true_substitutions_are_proved(verifier: Verifier, name: str) -> None:
    src, dst = TRUE[name]
    verdict = verifier.prove(parse(src), parse(dst))
    assert verdict.proved, f"{name}: {src} => {dst}: {verdict.reason}"


def test_float_exact_only_without_rounding_ops() -> None:
    assert float_exact(parse("gelu(t(a))"), parse("t(gelu(a))"))
    assert not float_exact(parse("t(mm(a, c))"), parse("mm(t(c), t(a))"))


def test_one_shape_is_not_enough() -> None:
    with pytest.raises(ValueError, match="bindings"):
        Verifier(INPUTS, bindings=({"m": 2, "n": 3, "k": 4},))


def test_parse_names_the_bad_text() -> None:
    with pytest.raises(ValueError, match="takes 2 arguments"):
        parse("mm(a)")
    with pytest.raises(ValueError, match="not in the vocabulary"):
        parse("conv(a, b)")
