"""Expansion snapshots (peakcut.fission.reuse.ExpansionCache) on tiny BERT and ViT.

Covered:
- expand(..., reuse=cache) over a sequence of F-Trees (a root, the root with a nested node,
  the root with another nested node, a nested node alone at two n, the root at another n,
  a repeat) gives exactly what expand without a cache gives, compact and full, and the
  trees that share a prefix hit the cache;
- a snapshot is never taken for another graph object (a copy of the graph) or another order;
- the cache keeps at most `limit` entries;
- `link`: snapshots of an old base edited (by a view-only TASO site outside every F-Tree
  node, edited alike as rebase.alike checks) into snapshots of the rewritten base;
  expanding the new base from them gives the peak, latency, nodes and computation hash of a
  fresh expansion, and a site that would make an outside node read a region's output
  directly is not carried.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import peakcut
from peakcut.cost import get_cost_model
from peakcut.fission.build import find_ftree
from peakcut.fission.dgraph import DGraph
from peakcut.fission.expand import expand
from peakcut.fission.expanded import Expanded
from peakcut.fission.ftree import FTree, divisors
from peakcut.fission.loss import detach_loss
from peakcut.fission.reuse import ExpansionCache
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.optimizer.compact import RepeatedCost
from peakcut.optimizer.rebase import alike
from peakcut.optimizer.state import computation_hash
from peakcut.rules import RULES
from peakcut.simulate import simulate_timeline
from peakcut.transform.site import RewriteSite
from peakcut.workloads import get_workload

VIEW_ONLY = ("drop_identity", "cancel_transposes", "fold_views")


@functools.cache
def step(name: str) -> tuple[Graph, FTree, DGraph]:
    inst = get_workload(name).build("tiny")
    base = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
    tree, dgraph = find_ftree(base, list(base.order), 4, batch_only=True)
    return base, tree, dgraph


def trees(tree: FTree) -> list[FTree]:
    """A root at n = 2, then trees that start like it (nested nodes inside it), others that do
    not (a nested node alone at two n, the root at another n), and the second one again."""
    root = tree.roots()[0]
    length = tree.nodes[root].length
    n0, n1 = divisors(length)[0], divisors(length)[-1]
    nested = [k for k in tree.descendants(root) if divisors(tree.nodes[k].length // n0)]
    assert len(nested) >= 2 and n1 != n0, "tiny workload: want two nested nodes and two n for the root"
    a, b = nested[0], nested[1]
    inner = divisors(tree.nodes[a].length // n0)[0]
    alone = divisors(tree.nodes[a].length)
    at_root = tree.with_n(root, n0)
    return [at_root, at_root.with_n(a, inner), at_root.with_n(b, inner), tree.with_n(a, alone[0]),
            tree.with_n(a, alone[-1]), tree.with_n(root, n1), at_root.with_n(a, inner)]


def facts(ex: Expanded) -> dict[str, Any]:
    g = ex.graph
    return {"nodes": g.nodes, "tensors": g.tensors, "storages": g.storages, "control": g.control,
            "order": g.order, "inputs": g.inputs, "outputs": g.outputs,
            "expanded_order": ex.order, "copies": dict(ex.copies), "regions": ex.regions}


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("name", ["bert-base", "vit-base"])
def test_a_shared_cache_gives_the_uncached_expansions(name: str, compact: bool) -> None:
    """One cache across several trees: each expansion equals the one made without a cache."""
    base, tree, dgraph = step(name)
    order = list(base.order)
    cache = ExpansionCache()
    sequence = trees(tree)
    for t in sequence:
        cached = expand(base, order, t, dgraph, compact=compact, reuse=cache)
        plain = expand(base, order, t, dgraph, compact=compact)
        assert facts(cached) == facts(plain), [(f.id, f.n) for f in t.enabled()]
        for nid, node in cached.graph.nodes.items():
            assert node.tags == plain.graph.nodes[nid].tags
    # the two nested trees start from the root's snapshot, the repeat from its own
    assert cache.hits >= 3, (cache.hits, cache.misses)
    assert cache.hits + cache.misses == len(sequence)


def test_a_snapshot_is_only_for_its_own_graph_object_and_order() -> None:
    """A copy of the graph (another object) or another order misses."""
    base, tree, dgraph = step("bert-base")
    order = list(base.order)
    t = tree.with_n(tree.roots()[0], 2)
    cache = ExpansionCache()
    expand(base, order, t, dgraph, compact=True, reuse=cache)
    assert (cache.hits, cache.misses) == (0, 1)
    expand(base, order, t, dgraph, compact=True, reuse=cache)
    assert (cache.hits, cache.misses) == (1, 1)

    copy = base.copy()
    assert copy is not base
    ex = expand(copy, order, t, dgraph, compact=True, reuse=cache)
    assert (cache.hits, cache.misses) == (1, 2)
    assert facts(ex) == facts(expand(base, order, t, dgraph, compact=True))

    # the same graph object under another order (the first two nodes swapped): a miss
    other = [order[1], order[0], *order[2:]]
    expand(base, other, t, dgraph, compact=True, reuse=cache)
    assert (cache.hits, cache.misses) == (1, 3)
    # and in the other mode (full expansion) the compact snapshots are not used
    expand(base, order, t, dgraph, compact=False, reuse=cache)
    assert (cache.hits, cache.misses) == (1, 4)


def test_the_cache_keeps_at_most_limit_entries() -> None:
    """ExpansionCache(limit=2): older snapshots go first; results stay the uncached ones."""
    base, tree, dgraph = step("bert-base")
    order = list(base.order)
    cache = ExpansionCache(limit=2)
    sequence = trees(tree)
    for t in sequence:
        ex = expand(base, order, t, dgraph, compact=True, reuse=cache)
        assert len(cache) <= 2
        assert facts(ex) == facts(expand(base, order, t, dgraph, compact=True))
    assert len(cache) == 2
    # the lone nested node's snapshot was dropped since: expanding it again misses
    misses = cache.misses
    expand(base, order, sequence[3], dgraph, compact=True, reuse=cache)
    assert cache.misses == misses + 1


def _outside_sites(base: Graph, tree: FTree) -> list[RewriteSite]:
    members: set[int] = set().union(*(f.nodes for f in tree.nodes))
    return [s for s in RULES.rewrite_candidates(base, list(base.order), limit=64)
            if s.kind in VIEW_ONLY and not members.intersection(s.nodes)]


def _carried(name: str, t: FTree,
             site: RewriteSite) -> tuple[Expanded, Expanded, ExpansionCache, int] | None:
    """The new base (linked to the old one) expanded from a carried snapshot and afresh; the
    cache and how many were carried. None where the site does not edit the snapshots alike (rebase.alike, as the
    deriver carries them)."""
    base, _, dgraph = step(name)
    order = list(base.order)
    cache = ExpansionCache()
    expand(base, order, t, dgraph, compact=True, reuse=cache)
    rw = RULES.apply_rewrite(base, order, site)

    def edit(graph: Graph, snap_order: list[int]) -> tuple[Graph, list[int], tuple[int, ...]] | None:
        try:
            w = RULES.apply_rewrite(graph, snap_order, site)
        except ValueError:
            return None
        return (w.graph, list(w.order), tuple(w.removed)) if alike(graph, base, w, set(), set()) else None

    cache.link(base, order, rw.graph, dgraph, edit)
    hits, before = cache.hits, cache.carried
    from_snapshot = expand(rw.graph, list(rw.order), t, dgraph, compact=True, reuse=cache)
    carried = cache.carried - before
    if not carried:
        assert cache.hits == hits, "nothing carried: the new base has no snapshot of its own"
        return None
    assert cache.hits == hits + 1, "the new base's expansion should start from a carried snapshot"
    fresh = expand(rw.graph, list(rw.order), t, dgraph, compact=True)
    return from_snapshot, fresh, cache, carried


@pytest.mark.parametrize("name", ["bert-base", "vit-base"])
def test_carried_snapshots_give_the_fresh_peak_and_latency(name: str) -> None:
    """A view-only site outside every F-Tree node: the carried snapshot's expansion of the new
    base has the fresh expansion's simulated peak and latency (compact pricing) and nodes."""
    base, tree, dgraph = step(name)
    root = tree.roots()[0]
    nested = next(k for k in tree.descendants(root) if divisors(tree.nodes[k].length // 2))
    cost = get_cost_model("rtx3090")
    sites = _outside_sites(base, tree)
    assert {s.kind for s in sites} >= {"drop_identity", "cancel_transposes"}
    for t, few in ((tree.with_n(root, 2), 4), (tree.with_n(root, 2).with_n(nested, 2), 2)):
        for site in sites[:few]:
            found = _carried(name, t, site)
            if found is None:
                continue       # not edited alike (read a region's output directly): not carried
            got, fresh, _, carried = found
            assert carried == 1     # the longest snapshot, edited when asked for
            priced = RepeatedCost(cost, t)
            a = simulate_timeline(got.graph, got.order, priced)
            b = simulate_timeline(fresh.graph, fresh.order, priced)
            assert (a.peak_bytes, a.latency_seconds) == (b.peak_bytes, b.latency_seconds), site.description
            assert simulate(got.graph, got.order).peak_bytes == simulate(fresh.graph, fresh.order).peak_bytes
            assert got.graph.nodes == fresh.graph.nodes, site.description
            assert got.regions == fresh.regions


def test_carried_snapshots_give_the_fresh_computation_hash_for_dropped_identities() -> None:
    """drop_identity outside every F-Tree node: the carried expansion computes the same thing,
    control edges included (the same computation_hash as a fresh expansion)."""
    for name in ("bert-base", "vit-base"):
        base, tree, _ = step(name)
        t = tree.with_n(tree.roots()[0], 2)
        for site in [s for s in _outside_sites(base, tree) if s.kind == "drop_identity"][:2]:
            found = _carried(name, t, site)
            assert found is not None, site.description
            got, fresh, _, _ = found
            assert computation_hash(got.graph, got.order) == computation_hash(fresh.graph, fresh.order)
            assert got.graph.control == fresh.graph.control


def test_carried_snapshots_give_the_fresh_computation_hash_for_every_view_only_site() -> None:
    """Every view-only site outside every F-Tree node (bert-base, root at n = 2) that edits the
    snapshots alike: the carried expansion has the fresh one's computation_hash (control
    edges enter the hash). cancel_transposes at t_17 (cls.predictions.decoder) would make an
    outside node read the region's output directly, without the control edge to its last
    write that a fresh expansion gives it: it is not carried."""
    base, tree, _ = step("bert-base")
    t = tree.with_n(tree.roots()[0], 2)
    sites = _outside_sites(base, tree)[:4]
    refused = []
    for site in sites:
        found = _carried("bert-base", t, site)
        if found is None:
            refused.append(site.description)
            continue
        got, fresh, _, _ = found
        assert computation_hash(got.graph, got.order) == computation_hash(fresh.graph, fresh.order), \
            site.description
    assert len(refused) < len(sites)
    assert any("t_17" in r for r in refused), refused
