"""Compact expansion (expand(compact=True)): part 0 of each region only, priced per part.

What the optimizer's speed rests on, so it must hold exactly: on every tiny workload's
F-Tree (each node alone at its two smallest n, and nested pairs) and on two paper-size
graphs, the compact graph's simulated peak equals the full expansion's to the byte, and its
latency under RepeatedCost equals the full one's up to float summation order.
"""

from __future__ import annotations

import math

import pytest

import peakcut
from peakcut.cost import get_cost_model
from peakcut.fission.build import find_ftree
from peakcut.fission.expand import expand
from peakcut.fission.expanded import FissionError
from peakcut.fission.ftree import FTree, divisors
from peakcut.fission.loss import detach_loss
from peakcut.memory import simulate
from peakcut.optimizer.compact import RepeatedCost
from peakcut.simulate import simulate_timeline
from peakcut.workloads import get_workload

COST = get_cost_model("h200")


def configs(tree: FTree) -> list[FTree]:
    """Each node alone at its two smallest n, and each nested pair at (2, 2) where it divides."""
    out = [tree.with_n(f.id, n) for f in tree.nodes for n in divisors(f.length)[:2]]
    for f in tree.nodes:
        if f.parent is not None and 2 in divisors(f.length) and 2 in divisors(tree.nodes[f.parent].length):
            out.append(tree.with_n(f.parent, 2).with_n(f.id, 2))
    return out


def assert_compact_matches(g, order, tree: FTree, dgraph) -> bool:
    """True when the config expands (False: the full expansion refuses it, and so must compact)."""
    try:
        full = expand(g, order, tree, dgraph, check=False)
    except FissionError:
        with pytest.raises(FissionError):
            expand(g, order, tree, dgraph, check=False, compact=True)
        return False
    compact = expand(g, order, tree, dgraph, check=True, compact=True)
    a = simulate_timeline(full.graph, full.order, COST, "cpu")
    b = simulate_timeline(compact.graph, compact.order, RepeatedCost(COST, tree), "cpu")
    config = [(f.id, f.n) for f in tree.enabled()]
    assert b.peak_bytes == a.peak_bytes, config
    assert math.isclose(b.latency_seconds, a.latency_seconds, rel_tol=1e-9), config
    assert simulate(full.graph, full.order, "cpu").peak_bytes == simulate(compact.graph, compact.order, "cpu").peak_bytes
    parts = {(f.id, f.n) for f in tree.enabled()}
    assert len(compact.graph.nodes) < len(full.graph.nodes) or all(n == 1 for _, n in parts)
    return True


@pytest.mark.parametrize("name", ["bert-base", "vit-base", "gpt-neo-1.3b", "unet", "resnet50"])
def test_compact_expansion_has_the_full_peak_and_latency_on_tiny_workloads(name: str) -> None:
    inst = get_workload(name).build("tiny")
    base = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
    order = list(base.order)
    tree, dgraph = find_ftree(base, order, 4, batch_only=True)
    if not tree.nodes:
        pytest.skip(f"{name}: no batch F-Tree node")
    checked = [assert_compact_matches(base, order, t, dgraph) for t in configs(tree)]
    assert any(checked), f"{name}: no configuration expanded"


@pytest.mark.parametrize("name", ["vit-base", "bert-base"])
def test_compact_expansion_matches_at_paper_size(name: str) -> None:
    inst = get_workload(name).build("paper")
    base = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
    order = list(base.order)
    tree, dgraph = find_ftree(base, order, 4, batch_only=True)
    deepest = max(tree.nodes, key=lambda f: (f.parent is not None, -len(f.nodes))).id
    for t in (tree.with_n(0, 4), tree.with_n(deepest, 2), tree.with_n(0, 2).with_n(deepest, 2)):
        assert assert_compact_matches(base, order, t, dgraph)
