"""The hot-spot's idle storages (peakcut.rules.hotspot), where remat and swap are tried: a
storage read after the peak through its tensor and through the forward's detach of it (an
activation saved for the backward twice: ResNet's ReLU outputs, read by the next
convolution's backward and by their own threshold_backward) is one site, whose users are
every reader of both; swapping it there keeps eager's numbers and frees it across the peak.
The remat rule leaves such sites out (peakcut.rules.remat_rule)."""

from __future__ import annotations

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.check import check_graph
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.rules.hotspot import idle_storages
from peakcut.transform.rewrite import identity_views
from peakcut.workloads import get_workload

SPEC = peakcut.AdamW(lr=1e-3, weight_decay=1e-2)


def _detached_site(g, order):
    """The best idle site some of whose users read it through an identity view."""
    profile = simulate(g, order)
    for site in idle_storages(g, order, profile):
        views = set(identity_views(g, site.tensor))
        direct = [u for u in site.users if site.tensor in g.nodes[u].input_ids()]
        through = [u for u in site.users if views.intersection(g.nodes[u].input_ids())]
        if direct and through:
            return site
    return None


def test_an_activation_read_through_its_detach_is_one_swap_site() -> None:
    kind = "swap"
    inst = get_workload("resnet50").build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, SPEC, keep_grads=True)
    site = _detached_site(g, g.order)
    assert site is not None, "a ReLU output read directly and through its detach after the peak"
    assert g.nodes[site.node].op == "aten.relu.default"
    candidates = [c for c in RULES.hotspot_candidates(g, g.order, limit=10**6, kinds=(kind,))
                  if c.tensor == site.tensor]
    assert candidates, f"no {kind} candidate at {g.tensors[site.tensor].name}"
    r = candidates[0].apply(g, g.order)
    check_graph(r.graph)
    report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, SPEC,
                                       lambda _model: Step(r.graph, r.order), steps=3, rtol=1e-5, atol=1e-6)
    assert report.ok, f"{kind} {r.description}: {report}"
    before, after = simulate(g, g.order), simulate(r.graph, r.order)
    storage = g.tensors[site.tensor].storage
    alloc, free = after.storage_lifetime[storage]
    assert not alloc < after.peak_index < free or after.peak_bytes < before.peak_bytes, r.description
    measured = peakcut.measure(Step(r.graph, r.order), inst.model, inst.batch, method="cpu-profiler", repeats=1)
    assert abs(after.peak_bytes - measured.peak_bytes) <= 0.05 * measured.peak_bytes
    remats = RULES.hotspot_candidates(g, g.order, limit=10**6, kinds=("remat",))
    assert remats and site.tensor not in {c.tensor for c in remats}
