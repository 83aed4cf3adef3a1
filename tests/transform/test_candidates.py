"""Hot-spot candidates: only tensors idle across the simulated peak, only applicable rules, never
caller-held tensors for swaps, never random ops for remat, bounded and sorted by score."""

from __future__ import annotations

import pytest

import peakcut
from peakcut.ir.check import check_graph
from peakcut.ir.registry import lookup
from peakcut.ir.tags import RematTag, SwapTag
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.transform import why_not_remat
from peakcut.workloads import get_workload
from tests.transform.conftest import random_topological_order

IDLE_RULES = ("swap", "remat")   # the rules tried at storages idle across the peak (this file's subject)


@pytest.fixture
def graphs(cnn_graph, cnn_train_graph, inplace_graph, dropout_graph, empty_like_graph):
    return {"cnn": cnn_graph, "cnn_train": cnn_train_graph, "inplace": inplace_graph,
            "dropout": dropout_graph, "empty_like": empty_like_graph}


def test_candidates_sit_across_the_peak_and_apply(cnn_train_graph):
    g = cnn_train_graph
    profile = simulate(g, g.order)
    peak = profile.peak_index
    pos = {n: i for i, n in enumerate(g.order)}
    cands = RULES.hotspot_candidates(g, g.order, profile, limit=50, kinds=IDLE_RULES)
    assert {c.kind for c in cands} == {"swap", "remat"}
    assert [c.score for c in cands] == sorted((c.score for c in cands), reverse=True)
    for c in cands:
        storage = g.tensors[c.tensor].storage
        alloc, free = profile.storage_lifetime[storage]
        assert alloc < peak < free and c.bytes == g.storages[storage]
        assert pos[c.node] < peak and all(pos[u] > peak for u in c.users)
        accesses = [i for i, n in enumerate(g.order)
                    if any(g.tensors[t].storage == storage
                           for t in (*g.nodes[n].input_ids(), *g.nodes[n].output_ids()))]
        before = max(i for i in accesses if i < peak)
        after = min(i for i in accesses if i > peak)
        assert c.score == c.bytes * min(peak - before, after - peak)
        r = c.apply(g, g.order)
        check_graph(r.graph)
def test_never_swaps_parameters_or_optimizer_state(graphs):
    resnet = get_workload("resnet50").build("tiny")
    graphs = {**graphs, "resnet50": peakcut.capture(resnet.model, resnet.batch, resnet.loss_fn,
                                                    "adamw")}
    for name, g in graphs.items():
        for order in (g.order, random_topological_order(g, seed=1)):
            for c in RULES.hotspot_candidates(g, order, limit=100, kinds=IDLE_RULES):
                meta = g.tensors[c.tensor]
                assert not meta.role.caller_held, (name, c)
                assert meta.storage not in g.caller_held_storages(), (name, c)


def test_random_ops_are_never_remat_candidates(dropout_graph):
    g = dropout_graph
    random_nodes = [n for n in g.order
                    if (info := lookup(g.nodes[n].op)) is not None and info.random]
    random_nodes += [n for n in g.order if "bernoulli" in g.nodes[n].op]
    assert len(random_nodes) >= 2  # randn_like and dropout's bernoulli_
    for n in random_nodes:
        users = [u for t in g.nodes[n].output_ids() for u in g.users(t)]
        assert why_not_remat(g, g.order, n, users or [g.order[-1]]) is not None
    cands = RULES.hotspot_candidates(g, g.order, limit=100, kinds=("remat",))
    assert not [c for c in cands if c.node in random_nodes]
    assert all(lookup(g.nodes[c.node].op) is not None for c in cands)


def test_no_candidates_when_only_gradients_are_live(cnn_graph):
    """With gradients kept as outputs the small CNN peaks at its last backward op, where
    everything live is a gradient (a program output) or caller-held: nothing to try."""
    assert RULES.hotspot_candidates(cnn_graph, cnn_graph.order, kinds=IDLE_RULES) == []


def test_limit_and_kinds(cnn_train_graph):
    g = cnn_train_graph
    assert RULES.hotspot_candidates(g, g.order, limit=0) == []
    one = RULES.hotspot_candidates(g, g.order, limit=1, kinds=IDLE_RULES)
    assert sorted(c.kind for c in one) == ["remat", "swap"]
    assert {c.kind for c in RULES.hotspot_candidates(g, g.order, kinds=("swap",))} == {"swap"}
    with pytest.raises(ValueError, match="unknown candidate kinds"):
        RULES.hotspot_candidates(g, g.order, kinds=("fission",))
    with pytest.raises(ValueError, match="limit"):
        RULES.hotspot_candidates(g, g.order, limit=-1)
    with pytest.raises(ValueError, match="another order"):
        RULES.hotspot_candidates(g, g.order, simulate(g, list(reversed(g.order))))
    with pytest.raises(ValueError, match="stale order"):
        RULES.hotspot_candidates(g, g.order[1:])


def test_candidates_compose(cnn_train_graph):
    """Rules applied one after another, candidates recomputed on each new graph and order."""
    g, order = cnn_train_graph, cnn_train_graph.order
    for kind in ("remat", "swap", "remat", "swap"):
        (c,) = RULES.hotspot_candidates(g, order, limit=1, kinds=(kind,))
        r = c.apply(g, order)
        check_graph(r.graph)
        g, order = r.graph, r.order
    assert sum(1 for n in g.nodes.values() if n.tags.get(RematTag) is not None) == 2
    assert sum(1 for n in g.nodes.values() if n.tags.get(SwapTag) is not None) == 4
