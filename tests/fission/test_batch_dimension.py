"""The batch dimension through training-mode BatchNorm, convex cores of regions, and the
batch-fission bound, on the tiny workloads (captured, nothing run)."""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import peakcut
from peakcut.fission import (
    FTree,
    batch_components,
    batch_fission_bound,
    build_dgraph,
    expand,
    find_ftree,
)
from peakcut.fission.build import BATCH_STATISTICS, batch_component, best_root_at_two
from peakcut.fission.loss import detach_loss
from peakcut.fission.trans import _leaves_and_returns, convex_core
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.workloads import get_workload


@functools.cache
def step(name: str) -> Graph:
    inst = get_workload(name).build("tiny")
    return detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))


@pytest.mark.parametrize("name", ["resnet50", "unet"])
def test_batch_norm_cuts_the_batch_dimension_into_stretches(name: str) -> None:
    g = step(name)
    dgraph = build_dgraph(g)
    found = batch_components(g, dgraph)
    assert len(found) > 2, f"{name}: one component per stretch between batch norms expected"
    bn_nodes = {nid for nid in g.order if g.nodes[nid].op in BATCH_STATISTICS}
    assert bn_nodes
    for comp, _ in found:
        assert not comp.nodes & bn_nodes, "a batch-statistics op was given a batch label"
    # both batch inputs (data and labels) start components; those the data input starts keep
    # its readers as sources
    data_readers = set(g.users(g.inputs[g.input_names.index("batch:0")]))
    with_sources = [sources for _, sources in found if sources is not None]
    assert with_sources and all(sources and sources <= data_readers for sources in with_sources)
    labels_readers = set(g.users(g.inputs[g.input_names.index("batch:1")]))
    assert any(comp.nodes & labels_readers for comp, _ in found)


def test_a_transformer_has_one_batch_component_from_the_data_input() -> None:
    g = step("bert-base")
    dgraph = build_dgraph(g)
    comp, sources = batch_component(g, dgraph)
    assert sources
    assert batch_components(g, dgraph)[0][0].id == comp.id


def test_unet_tail_from_the_last_batch_norm_through_the_loss_is_the_best_root() -> None:
    """Without a workspace model (the same on every machine: the F-Tree's hot-spots follow the
    model it is given, and a CPU's convolution scratch depends on its threads and ISA: on this
    2-core VM at one thread the tiny U-Net's peak moves to a convolution's forward), the root
    that splits best is the stretch from the last batch norm through the loss and back; split
    in two it keeps the peak (its saved activations stay whole)."""
    g = step("unet")
    tree, dgraph = find_ftree(g, batch_only=True, workspace=None)
    root, peak = best_root_at_two(g, tree, dgraph, workspace=None)
    ops = {g.nodes[v].op for v in tree.nodes[root].nodes}
    assert {"aten.nll_loss2d_forward.default", "aten.nll_loss2d_backward.default",
            "aten.convolution_backward.default"} <= ops
    assert peak <= 1.001 * simulate(g, workspace=None).peak_bytes


@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 40))
@settings(max_examples=60, deadline=None)
def test_convex_core_is_a_convex_connected_subset(seed: int, k: int) -> None:
    import random

    g = step("resnet50")
    rng = random.Random(seed)
    start = rng.randrange(len(g.order) - k)
    S = frozenset(rng.sample(g.order[start:start + 3 * k], k))
    core = convex_core(g, S)
    assert core <= S
    if core:
        assert not _leaves_and_returns(g, core)
        # weakly connected: a walk over edges inside the core reaches every node
        seen, frontier = set(), [next(iter(core))]
        while frontier:
            v = frontier.pop()
            if v in seen:
                continue
            seen.add(v)
            frontier.extend(u for u in (*g.predecessors(v), *g.successors(v)) if u in core)
        assert seen == core


@pytest.mark.parametrize("name", ["resnet50", "unet", "unetpp", "bert-base"])
def test_no_f_tree_node_goes_below_the_batch_fission_bound(name: str) -> None:
    g = step(name)
    tree, dgraph = find_ftree(g, batch_only=True)
    bound = batch_fission_bound(g, dgraph)
    eager = simulate(g).peak_bytes
    assert 0 < bound.bytes <= eager
    for f in tree.nodes:
        enabled = FTree(tuple(replace(x, n=x.length) if x.id == f.id else x for x in tree.nodes))
        ex = expand(g, list(g.order), enabled, dgraph)
        assert simulate(ex.graph, ex.order).peak_bytes >= bound.bytes, f"{name} node {f.id}"


def test_resnet_bound_sits_at_a_batch_norm() -> None:
    g = step("resnet50")
    bound = batch_fission_bound(g)
    assert g.nodes[bound.node].op in BATCH_STATISTICS
