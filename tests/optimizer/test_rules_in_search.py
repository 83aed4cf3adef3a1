"""The search's rules on a tiny BERT: TASO rewrites rebuild the F-Tree and keep fission;
fission + recipes replay; every derived program keeps eager's numbers (SGD, float64)."""

from __future__ import annotations

import random

import pytest

import peakcut
from peakcut.codegen.program import Step
from peakcut.cost import get_cost_model
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import MoveSettings, children
from peakcut.optimizer.derive import DeriveError, Deriver
from peakcut.rules import RULES
from peakcut.rules.phase import inside_regions
from peakcut.workloads import get_workload
from tests.helpers import in_float64

SPEC = peakcut.SGD(lr=1e-2, momentum=0.9)


@pytest.fixture(scope="module")
def case():
    inst = in_float64(get_workload("bert-base").build("tiny"))
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, SPEC, keep_grads=True)
    root = optimize_graph(g, time_budget=0, device="rtx3090").result.root
    return inst, root, Deriver(get_cost_model("rtx3090"))


def exact(inst, state, deriver: Deriver | None = None) -> None:
    """The state's program (re-derived on the full expansion when compact) keeps the numbers;
    the compact estimate of the peak is the full program's."""
    if state.compact:
        full = (deriver or Deriver(get_cost_model("rtx3090"))).exact(state)
        assert not full.compact and full.peak_bytes == state.peak_bytes, full.applied
        state = full
    report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, SPEC,
                                       lambda _m: Step(state.program, state.order), steps=2,
                                       rtol=1e-7, atol=1e-9)
    assert report.ok, f"{state.applied}: {report}"


def test_a_qkv_merge_then_fission_then_swap_keeps_the_numbers(case) -> None:
    inst, root, deriver = case
    site = next(s for s in deriver.sites(root, 16) if s.kind == "merge_matmuls")
    merged = deriver.resolve(deriver.with_taso(root, site))
    assert merged.base_digest != root.base_digest
    assert any(n.op == "aten.cat.default" for n in merged.program.nodes.values())
    exact(inst, merged)
    fission = next(m for m in children(merged, deriver, MoveSettings.only("fission"),
                                    random.Random(0)) if m.kind == "fission")
    split = fission.build()
    assert split.fission()
    exact(inst, split)
    swaps = [m for m in children(split, deriver, MoveSettings.only("swap"),
                              random.Random(0)) if m.kind == "swap"]
    for move in swaps[:2]:
        try:
            state = move.build()
        except DeriveError:
            continue
        exact(inst, state)


def test_taso_inside_an_enabled_region_is_refused_and_fission_survives_outside_rewrites(case) -> None:
    inst, root, _ = case
    deriver = Deriver(get_cost_model("rtx3090"))
    sites = deriver.sites(root, 64)
    splits = [m.build() for m in children(root, deriver, MoveSettings.only("fission"),
                                       random.Random(0)) if m.kind == "fission"]
    split = max(splits, key=lambda s: sum(len(f.nodes) for f in s.tree.enabled()))
    region = set().union(*(f.nodes for f in split.tree.enabled()))
    inside = [s for s in sites if set(s.nodes) & region and not inside_regions(RULES.rewrite_rule(s.kind))]
    assert inside
    with pytest.raises(DeriveError, match="inside an enabled fission region"):
        deriver.with_taso(split, inside[0])
    outside = [s for s in sites if not set(s.nodes) & region]
    assert outside
    for site in outside[:2]:
        state = deriver.with_taso(split, site)
        assert state.fission(), state.applied
        exact(inst, state)


def test_a_site_rewrites_a_base_once_for_every_state_on_it(case) -> None:
    """States sharing a base share its rewrite at a site (Deriver.rebased): the same new base,
    F-Tree and digest, and the child is what a fresh deriver builds."""
    inst, root, _ = case
    deriver = Deriver(get_cost_model("rtx3090"))
    site = next(s for s in deriver.sites(root, 16) if s.kind == "merge_matmuls")
    swap = next(m for m in children(root, deriver, MoveSettings.only("swap"),
                                 random.Random(0)) if m.kind == "swap").build()
    a, b = (deriver.resolve(deriver.with_taso(parent, site)) for parent in (root, swap))
    assert a.base is b.base and a.tree is b.tree
    assert len(deriver.rewritten) == 1
    fresh = Deriver(get_cost_model("rtx3090"))
    fresh = fresh.resolve(fresh.with_taso(swap, site))
    assert (fresh.digest, fresh.peak_bytes, fresh.latency_s) == (b.digest, b.peak_bytes, b.latency_s)
    assert fresh.base_digest == b.base_digest
    exact(inst, b)


def test_offload_param_at_every_parameter_is_offered_after_host_update_at_every_one() -> None:
    """After host_update at every parameter, offload_param's bulk move is still offered (its
    sites' readers include the host update's copies, which are not base nodes: a batched
    rule's recipe leaves them out), and the two together keep eager's numbers."""
    inst = in_float64(get_workload("bert-base").build("tiny"))
    spec = peakcut.AdamW(lr=1e-2, eps=1e-4)
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, spec, keep_grads=True)
    opt = optimize_graph(g, time_budget=0, device="h100")
    root, deriver = opt.result.root, opt.deriver

    def bulk(state, kind: str):
        (move,) = [m for m in children(state, deriver, MoveSettings.only(kind), random.Random(0))
                   if m.kind == kind and m.description.startswith(f"{kind} at all")]
        return move.build()

    updated = bulk(root, "host_update")
    both = bulk(updated, "offload_param")
    assert {r.kind for r in both.recipes} == {"host_update", "offload_param"}
    assert both.peak_bytes < updated.peak_bytes
    report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, spec,
                                       lambda _m: Step(both.program, both.order), steps=2,
                                       rtol=1e-7, atol=1e-9)
    assert report.ok, f"{both.applied}: {report}"
