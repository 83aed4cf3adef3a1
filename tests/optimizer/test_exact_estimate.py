"""The search keeps time for the full expansion of its best (Deriver.expected_exact_seconds):
the node count it prices is the full expansion's, for one region and for a region nested in
another (each of its parts runs in every part of the enclosing one)."""

from __future__ import annotations

import pytest

import peakcut
from peakcut.cost import get_cost_model
from peakcut.fission.ftree import divisors
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.derive import Deriver
from peakcut.optimizer.timing import full_expansion_nodes
from peakcut.workloads import get_workload


@pytest.fixture(scope="module")
def case():
    inst = get_workload("gpt2-xl").build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    root = optimize_graph(g, time_budget=0, device="h100").result.root
    return root, Deriver(get_cost_model("h100"), "cpu")


def _nested_pair(root) -> tuple[int, int]:
    tree = root.tree
    return next((f.parent, f.id) for f in tree.nodes
                if f.parent is not None and divisors(f.length) and divisors(tree.node(f.parent).length))


def test_one_region_and_a_nested_pair_are_counted_as_the_full_expansion(case) -> None:
    root, deriver = case
    parent, child = _nested_pair(root)
    tree = root.tree
    for fissioned in (tree.with_n(child, divisors(tree.node(child).length)[-1]),
                      tree.with_n(parent, 2).with_n(child, 2)):
        compact = deriver.with_tree(root, fissioned, "test")
        assert compact.compact
        full = len(deriver.exact(compact).program.nodes)
        assert full_expansion_nodes(compact) == full, fissioned.summary()


def test_the_seconds_follow_the_measured_exact_derivations(case) -> None:
    root, deriver = case
    _, child = _nested_pair(root)
    compact = deriver.with_tree(root, root.tree.with_n(child, 2), "test")
    assert deriver.expected_exact_seconds(root) == 0.0      # exact already
    assert deriver.expected_exact_seconds(compact) > 0      # priced from the simulations so far
    deriver.exact(compact)
    per_node = sorted(deriver.node_seconds["exact"])[len(deriver.node_seconds["exact"]) // 2]
    assert deriver.expected_exact_seconds(compact) == pytest.approx(full_expansion_nodes(compact) * per_node)
