"""Generated substitutions applied to a captured step: each site's destination written as
ATen calls (peakcut.taso.calls) and put in place by transform.taso.substitute; the rewritten
step gives eager PyTorch's numbers."""

from __future__ import annotations

from typing import Any

import pytest

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.check import check_graph
from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.taso import load
from peakcut.taso.calls import Ref, calls
from peakcut.taso.match import Match, find_matches
from peakcut.taso.ruleset import Rule
from peakcut.taso.term import size
from peakcut.transform.rewrite import RuleError
from peakcut.transform.taso.substitute import Slot, substitute, why_not_substitute
from tests.taso.conftest import SGD


def _apply(g: Graph, order: list[int], rule: Rule, m: Match) -> Any:
    seq, root = calls(rule.dst, rule.inputs, m.sizes)

    def ref(r: Ref) -> TensorRef | Slot:
        return Slot(r) if isinstance(r, int) else TensorRef(m.inputs[r])

    node = g.producer(m.root)
    return substitute(g, order, node, [(c.aten, c.args(ref)) for c in seq], ref(root), "generated")


def test_substitutions_keep_eager_numbers(toy: Any) -> None:
    model, batch, loss_fn, g = toy
    rules = {r.name: r for r in load().rules}
    order, fired = list(g.order), []
    for _ in range(12):
        sites = [m for m in find_matches(g, list(rules.values()), order)
                 if size(rules[m.rule].dst) <= size(rules[m.rule].src)]
        if not sites:
            break
        rule = rules[sites[0].rule]
        rw = _apply(g, order, rule, sites[0])
        g, order = rw.graph, list(rw.order)
        fired.append(rule.describe())
    assert len(fired) >= 5, fired
    check_graph(g)
    report = peakcut.check_equivalence(model, batch, loss_fn, SGD, lambda _m: Step(g, order),
                                       steps=2, rtol=1e-5, atol=1e-6)
    assert report.ok, str(report)


def test_what_cannot_be_substituted_is_refused(toy: Any) -> None:
    g = toy[3]
    out = g.outputs[0]
    producer = g.producer(out)
    assert producer is not None
    assert "program output" in (why_not_substitute(g, g.order, producer, [], TensorRef(g.inputs[0])) or "")
    mm = next(n for n in g.order if g.nodes[n].op == "aten.mm.default")
    x = g.nodes[mm].args[0]
    assert "not before it" in (why_not_substitute(g, g.order, mm, [("aten.t.default", (Slot(0),))], Slot(0)) or "")
    with pytest.raises(RuleError, match="another shape"):
        substitute(g, g.order, mm, [("aten.t.default", (x,))], Slot(0))
