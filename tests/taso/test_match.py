"""Sites of generated substitutions in a captured step: the matcher reads ATen nodes as the
vocabulary's ops and binds the rules' symbolic shapes to the real sizes."""

from __future__ import annotations

import pytest

from peakcut.ir.graph import Graph
from peakcut.taso import load
from peakcut.taso.match import classify, find_matches
from peakcut.taso.ruleset import Rule
from peakcut.taso.term import parse


@pytest.fixture(scope="module")
def g(toy: tuple[object, object, object, Graph]) -> Graph:
    return toy[3]


def _rule(src: str, dst: str, **shapes: str) -> Rule:
    inputs = {k: tuple((d,) for d in v.split("x")) for k, v in shapes.items()}
    return Rule("test", parse(src), parse(dst), inputs, True)  # type: ignore[arg-type]


def test_committed_rules_have_sites(g: Graph) -> None:
    rules = {r.name: r for r in load().rules}
    found = {rules[m.rule].src for m in find_matches(g, list(rules.values()))}
    assert parse("t(t(a))") in found                 # the backward reads h as t(t(h))
    assert parse("slice1a(cat1(a, b))") in found
    assert parse("sum1(mm(a, c))") in found


def test_shapes_bind_to_the_real_sizes(g: Graph) -> None:
    (m,) = [m for m in find_matches(g, [_rule("sum1(mm(a, c))", "mm(a, sum1(c))", a="mxn", c="nxk")])]
    assert m.sizes == {"m": 6, "n": 8, "k": 4}
    assert [g.tensors[m.inputs[k]].shape for k in ("a", "c")] == [(6, 8), (8, 4)]
    # a rule whose inputs must be square finds no 6 x 8 by 8 x 4 matmul
    assert not find_matches(g, [_rule("sum1(mm(a, c))", "mm(a, sum1(c))", a="nxn", c="nxn")])


def test_only_the_vocabularys_nodes_are_read(g: Graph) -> None:
    kinds = {g.nodes[n].op: classify(g, n) for n in g.order}
    assert kinds["aten.mm.default"] is not None
    assert kinds["aten.threshold_backward.default"] is None
    gelus = [n for n in g.order if g.nodes[n].op == "aten.gelu.default"]
    assert gelus and all(classify(g, n) is None for n in gelus)      # tanh GELU: another function
    slices = [n for n in g.order if g.nodes[n].op == "aten.slice.Tensor"
              and g.nodes[n].args[2:4] == (3, 9)]
    assert slices and all(classify(g, n) is None for n in slices)
