"""recompute_activations on tiny CNNs: the backward reads recomputes of the saved ReLU outputs
(and of the batch norms' results behind them, as normalizes from the saved statistics), the
step gives eager's numbers (loss, gradients, parameters, running statistics, AdamW state)
over 3 steps, and the simulated peak does not rise
(tiny models peak where the parameters dominate); the rule's sites.

In float64 (tests.helpers.in_float64): the normalize from the saved statistics is the
kernel's formula, but where the kernel's vector loop and addcmul's round an element apart
(the last bit), AdamW scales that into updates that differ in the fourth digit by step 3 in
float32 (tiny ResNet-50's bn1.bias); in float64 it stays near 1e-13."""

from __future__ import annotations

import copy

import pytest

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.check import check_graph
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.rules.query import Query
from peakcut.transform.activations import (
    recompute_activations,
    saved_activations,
    why_not_recompute_activation,
)
from peakcut.workloads import get_workload
from tests.helpers import in_float64


@pytest.mark.parametrize("name", ["resnet50", "unet", "unetpp"])
def test_recomputed_activations_give_eagers_numbers(name):
    w = in_float64(get_workload(name).build("tiny"))
    g = peakcut.capture(w.model, w.batch, w.loss_fn, "adamw", keep_grads=True)
    nodes = saved_activations(g)
    assert nodes and all(g.nodes[v].op == "aten.relu.default" for v in nodes)
    r, reasons = recompute_activations(g, g.order, nodes)
    assert r is not None and reasons == [None] * len(nodes)
    check_graph(r.graph)
    ops = {r.graph.nodes[v].op for v in r.added}
    assert "aten.native_batch_norm.default" in ops and "aten.addcmul.default" not in ops   # the kernel again: bit for bit
    assert not {"aten.convolution.default"} & ops
    # one recompute per saved activation: later readers share it
    assert sum(r.graph.nodes[v].op == "aten.relu.default" for v in r.added) == len(nodes)
    assert all("nothing outside the forward" in why_not_recompute_activation(r.graph, r.order, v) for v in nodes)
    assert simulate(r.graph, r.order).peak_bytes <= simulate(g, g.order).peak_bytes
    report = peakcut.check_equivalence(copy.deepcopy(w.model), w.batch, w.loss_fn, peakcut.AdamW(),
                                       lambda _m: Step(r.graph, r.order), steps=3)
    assert report.ok, str(report)


def test_rule_sites_and_reasons():
    w = get_workload("resnet50").build("tiny")
    g = peakcut.capture(w.model, w.batch, w.loss_fn, "adamw")
    rule = RULES.rewrite_rule("recompute_activations")
    sites = list(rule.sites(Query(g, g.order)))
    n = len(saved_activations(g))
    assert [len(s.nodes) for s in sites] == [n, n // 2]
    assert rule.why_not(g, g.order, sites[1]) is None
    r = rule.apply(g, g.order, sites[1])
    check_graph(r.graph)
    assert "first" in sites[1].description
    done = set(sites[1].nodes)
    assert all("nothing outside the forward" in why_not_recompute_activation(r.graph, r.order, v) for v in done)
    assert "not in the graph" in why_not_recompute_activation(g, g.order, 10**9)


@pytest.mark.parametrize("name", ["vit-base", "bert-base"])
def test_activations_read_through_a_forward_view(name):
    """A transformer's GELU output is read by the backward through the next linear's `view`
    (its weight gradient): the view is made again from a recompute, so the GELU output is
    freed after the forward, and the step gives eager's numbers."""
    w = in_float64(get_workload(name).build("tiny"))
    g = peakcut.capture(w.model, w.batch, w.loss_fn, "adamw", keep_grads=True)
    gelus = [v for v in saved_activations(g) if g.nodes[v].op == "aten.gelu.default"]
    assert gelus and all(why_not_recompute_activation(g, g.order, v) is None for v in gelus)
    (everything, *_) = RULES.rewrite_rule("recompute_activations").sites(Query(g, g.order))
    assert set(gelus) <= set(everything.nodes)        # the search is offered them
    r, reasons = recompute_activations(g, g.order, gelus)
    assert r is not None and reasons == [None] * len(gelus)
    check_graph(r.graph)
    again = [v for v in r.added if r.graph.nodes[v].name.endswith("_again")]
    assert again
    assert sum(r.graph.nodes[v].op == "aten.gelu.default" for v in r.added) == len(gelus)
    for v in gelus:            # nothing outside the forward reads the output, directly or through a view
        assert "nothing outside the forward" in why_not_recompute_activation(r.graph, r.order, v)
        assert v not in saved_activations(r.graph)
    assert simulate(r.graph, r.order).peak_bytes <= simulate(g, g.order).peak_bytes
    report = peakcut.check_equivalence(copy.deepcopy(w.model), w.batch, w.loss_fn, peakcut.AdamW(),
                                       lambda _m: Step(r.graph, r.order), steps=3)
    assert report.ok, str(report)
