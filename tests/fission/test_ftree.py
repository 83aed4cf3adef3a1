"""Algorithm 1 on a hand-worked example (in the style of MAGIS Fig. 6) and the F-Tree mutation rules."""

from __future__ import annotations

import pytest

from peakcut.fission import (
    ComponentView,
    FTree,
    FTreeError,
    MemoryView,
    compute_scores,
    ftree_from_components,
)
from peakcut.fission.analyzer import dominator_tree, select_dominators

# A training step reduced to its skeleton; node k allocates storage k of 1 byte.
#   forward  0 -> 1 -> 2 -> 3 -> 4 (loss)
#   backward 5 (reads 4), 6 (reads 5, 3), 7 (reads 6, 2), 8 (reads 7, 1)
READS = {0: (), 1: (0,), 2: (1,), 3: (2,), 4: (3,), 5: (4,), 6: (5, 3), 7: (6, 2), 8: (7, 1)}


def example() -> tuple[ComponentView, MemoryView]:
    comp = ComponentView(nodes=tuple(READS), preds=READS, labels=dict.fromkeys(READS, "b"), length=4)
    mem = MemoryView(allocs={v: {v: 1} for v in READS},
                     reads={v: frozenset(r) for v, r in READS.items()},
                     hot=frozenset({1, 2, 3, 4, 5}), size=dict.fromkeys(READS, 1))
    return comp, mem


def test_hand_worked_example_with_five_levels():
    """Every tensor is 1 byte; L = 5; n = 2.

    Memory hot-spots. In order 0..8, storage k lives from node k to its last reader:
    s0 [0,1], s1 [1,8], s2 [2,7], s3 [3,6], s4 [4,5], s5 [5,6], s6 [6,7], s7 [7,8], s8 [8].
    The step peaks at node 5 with {s1, s2, s3, s4, s5} = 5 bytes, so H = {1, 2, 3, 4, 5}.

    Dominator tree (virtual root above entry 0). The chain 0-1-2-3-4-5 dominates
    itself. idom(6) = 3 (paths 5->6 and 3->6 meet at 3), idom(7) = 2,
    idom(8) = 1. So T is:
        0 -> 1 -> {2, 8};  2 -> {3, 7};  3 -> {4, 6};  4 -> 5

    Heat (Eq. 3), the hot-spot bytes in T.des(v):
        h(5)=1, h(4)=2, h(3)=3, h(2)=4, h(1)=5, h(0)=5, h(6)=h(7)=h(8)=0

    Score (Eq. 4), 0.5 h(v) minus the non-hot inputs of S = T.des(v) - {v}:
        s(0) = 2.5 - |s0| = 1.5   (S = 1..8 reads s0, which is not hot)
        s(1) = 2.5 - 0    = 2.5   (S = 2..8 reads only s1, which is hot)
        s(2) = 2.0 - 0    = 2.0   (S = 3..7 reads s2, hot)
        s(3) = 1.5 - 0    = 1.5   (S = {4, 5, 6} reads s3, hot)
        s(4) = 1.0 - 0    = 1.0   (S = {5} reads s4, hot)
        s(5) = 0.5             (S is empty)
        h = 0 for 6, 7 and 8, so their score is never needed.

    Normalised by s_max = 2.5:
        5: 0.2, 4: 0.4, 0: 0.6, 3: 0.6, 2: 0.8, 1: 1.0

    Bands i/5 <= s < (i+1)/5:
        i=1 {5}, i=2 {4}, i=3 {0, 3}, i=4 {2}, i=5 {1}

    In each band, keep the nodes with no T-descendant in the same band. In
    band 3, node 0 has 3 below it, so only 3 is kept. The candidates
    S = T.des(v) - {v} are:
        5 -> {} (empty, dropped), 4 -> {5}, 3 -> {4, 5, 6},
        2 -> {3, 4, 5, 6, 7}, 1 -> {2, ..., 8}

    They nest into one chain, so the F-Tree has 4 levels with one node each:
        {2..8} > {3..7} > {4, 5, 6} > {5}
    """
    comp, mem = example()
    assert dominator_tree(comp) == {0: None, 1: 0, 2: 1, 3: 2, 4: 3, 5: 4, 6: 3, 7: 2, 8: 1}
    scores = compute_scores(comp, mem, n=2, levels=5)
    assert scores.heat == {0: 5, 1: 5, 2: 4, 3: 3, 4: 2, 5: 1, 6: 0, 7: 0, 8: 0}
    assert scores.score == {0: 1.5, 1: 2.5, 2: 2.0, 3: 1.5, 4: 1.0, 5: 0.5}
    assert select_dominators(scores, levels=5) == [(5, 1), (4, 2), (3, 3), (2, 4), (1, 5)]
    tree = ftree_from_components([comp], mem, levels=5)
    regions = sorted((sorted(f.nodes) for f in tree.nodes), key=len)
    assert regions == [[5], [4, 5, 6], [3, 4, 5, 6, 7], [2, 3, 4, 5, 6, 7, 8]]
    assert tree.levels() == 4 and tree.nodes_per_level() == [1, 1, 1, 1]
    by_size = sorted(tree.nodes, key=lambda f: len(f.nodes))
    for child, parent in zip(by_size, by_size[1:], strict=False):
        assert child.parent == parent.id
    assert [f.dominator for f in by_size] == [4, 3, 2, 1]
    assert all(f.n == 1 for f in tree.nodes)


def _chain_tree() -> FTree:
    comp, mem = example()
    return ftree_from_components([comp], mem, levels=5)


def test_mutation_rules_follow_section_5_1():
    tree = _chain_tree()
    leaf = min(tree.nodes, key=lambda f: len(f.nodes)).id
    parent = tree.nodes[leaf].parent
    root = tree.roots()[0]
    # only the leaf can be enabled at first
    assert tree.mutations() == [("enable", leaf)]
    assert "not a leaf" in tree.why_not_enable(root)
    t1 = tree.enable(leaf)
    assert t1.nodes[leaf].n == 2
    # enable the parent of an enabled node, lift, mutate, disable
    assert ("enable", parent) in t1.mutations() and ("lift", leaf) in t1.mutations()
    t2 = t1.mutate(leaf)
    assert t2.nodes[leaf].n == 4                      # next divisor of 4
    assert t2.why_not_mutate(leaf) is not None        # 4 is the largest divisor
    t3 = t1.lift(leaf)
    assert t3.nodes[leaf].n == 1 and t3.nodes[parent].n == 2
    t4 = t1.enable(parent)
    assert "enabled descendant" in t4.why_not_disable(parent)
    assert "enabled ancestor" in t4.why_not_lift(leaf)
    t5 = t4.disable(leaf).disable(parent)
    assert all(f.n == 1 for f in t5.nodes)
    with pytest.raises(FTreeError, match="not enabled"):
        tree.disable(leaf)
    with pytest.raises(FTreeError, match="no node"):
        tree.enable(99)
    with pytest.raises(FTreeError, match="unknown F-Tree rule"):
        tree.apply("split", leaf)
