"""find_ftree on rewritten graphs: per-node caches of dimension rules and label lengths give
the same D-Graph and F-Tree as a fresh computation, and never a stale rule."""

from __future__ import annotations

import copy
import functools
from dataclasses import replace

import pytest

import peakcut
import peakcut.ir.dims.table as table
from peakcut.fission import build_dgraph, find_ftree
from peakcut.fission.dgraph import DGraph
from peakcut.fission.ftree import FTree
from peakcut.fission.loss import detach_loss
from peakcut.ir.dims import dim_rule, label_sizes
from peakcut.ir.dims.split import label_lengths
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.rules import RULES
from peakcut.workloads import get_workload


@functools.cache
def step(name: str) -> Graph:
    inst = get_workload(name).build("tiny")
    return detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))


def fresh(g: Graph) -> Graph:
    """A copy of g whose nodes are new objects (copies of them: nothing cached for them)."""
    edit = GraphEditor(g)
    for node in g.nodes.values():
        edit.replace_node(copy.copy(node))
    h = edit.finish()
    assert all(h.nodes[nid] is not g.nodes[nid] for nid in g.nodes)
    return h


def assert_same(a: tuple[FTree, DGraph], b: tuple[FTree, DGraph]) -> None:
    (tree_a, dg_a), (tree_b, dg_b) = a, b
    assert dg_a.rules == dg_b.rules
    assert dg_a.edges == dg_b.edges
    assert dg_a.components == dg_b.components
    assert dg_a.component_of == dg_b.component_of
    assert [(f.nodes, f.length, f.labels, f.component, f.parent) for f in tree_a.nodes] == \
        [(f.nodes, f.length, f.labels, f.component, f.parent) for f in tree_b.nodes]
    assert tree_a == tree_b
    for comp in dg_a.components:
        expected = {(x[0], y[0]) for x, y in dg_a.edges
                    if x in comp.vertices and y in comp.vertices}
        assert dg_a.node_edges(comp) == expected


@pytest.mark.parametrize("name", ["vit-base", "bert-base"])
def test_analyze_after_rewrites_matches_a_fresh_analysis(name: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    base = step(name)
    order = list(base.order)
    first = find_ftree(base, order, 4, batch_only=True)
    assert_same(first, find_ftree(fresh(base), order, 4, batch_only=True))
    built = [0]
    build_rule = table.build_rule

    def counting(g: Graph, nid: int) -> object:
        built[0] += 1
        return build_rule(g, nid)

    monkeypatch.setattr(table, "build_rule", counting)
    sites = RULES.rewrite_candidates(base, order, limit=8)
    assert sites, f"{name}: no TASO site to rewrite"
    for site in sites[:4]:
        rw = RULES.apply_rewrite(base, order, site)
        built[0] = 0
        got = find_ftree(rw.graph, list(rw.order), 4, batch_only=True)
        rebuilt = built[0]
        assert 0 < rebuilt < len(rw.graph.nodes) // 4, "unchanged nodes should reuse their rules"
        assert_same(got, find_ftree(fresh(rw.graph), list(rw.order), 4, batch_only=True))
        assert_same(got, find_ftree(rw.graph, list(rw.order), 4, batch_only=True))


def _unary_batch_node(g: Graph) -> int:
    """A node with one input and one output of the same shape, labelled at dim 0."""
    for nid in g.order:
        node = g.nodes[nid]
        if len(node.input_tuple) != 1 or len(node.output_tuple) != 1 or node.mutated_ids():
            continue
        (t,), (o,) = node.input_tuple, node.output_tuple
        shape = g.tensors[t].shape
        if len(shape) >= 2 and shape == g.tensors[o].shape and shape[0] % 2 == 0:
            rule = dim_rule(g, nid)
            if rule is not None and rule.inputs[0][0] is not None:
                return nid
    raise AssertionError("no unary node labelled at dim 0")


def test_changed_tensor_metas_give_the_new_rule() -> None:
    g = step("vit-base").copy()
    nid = _unary_batch_node(g)
    node = g.nodes[nid]
    (t,), (o,) = node.input_tuple, node.output_tuple
    old_rule = dim_rule(g, nid)
    old_lengths = dict(label_lengths(g, nid, old_rule))
    label = old_rule.inputs[0][0]

    def resized(first: int) -> Graph:
        edit = GraphEditor(g)   # the same Node object, other metas for its tensors
        for tid in (t, o):
            meta = g.tensors[tid]
            edit.set_tensor(replace(meta, shape=(first, *meta.shape[1:])))
        h = edit.finish()
        assert h.nodes[nid] is node
        return h

    # dim 0 of length 1: nothing divides it, so the label goes
    short = resized(1)
    rule = dim_rule(short, nid)
    assert rule == table.build_rule(short, nid)
    assert rule != old_rule and rule.inputs[0][0] is None
    assert label not in label_lengths(short, nid, rule)
    # another even length: the same labels, another length
    longer = resized(3 * g.tensors[t].shape[0])
    rule = dim_rule(longer, nid)
    assert rule == old_rule
    lengths = dict(label_lengths(longer, nid, rule))
    assert lengths[label] == 3 * old_lengths[label]
    assert lengths[label] == min(label_sizes(longer, nid, rule)[label])
    # and the original graph still gets its own rule and lengths back
    assert dim_rule(g, nid) == old_rule
    assert dict(label_lengths(g, nid, dim_rule(g, nid))) == old_lengths
    assert build_dgraph(g).rules[nid] == old_rule
