"""RULES.rewrite_candidates finds each kind's sites lazily (validating only as many as the limit needs):
it must return exactly the list of the straightforward eager algorithm kept here (every site
of every kind validated, then interleaved), for every limit and kind subset, on the tiny
workloads, on graphs with merged matmuls (un-merge sites) and on detach_loss graphs."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import peakcut
from peakcut.ir.graph import Graph
from peakcut.optimizer.api import detach_loss
from peakcut.rules import RULES
from peakcut.rules.query import Query
from peakcut.transform.rewrite import describe_node
from peakcut.transform.site import RewriteSite
from peakcut.transform.taso import algebra, matmul, matmul_merge, matmul_split, merge_groups
from peakcut.transform.taso.edit import is_view_op
from peakcut.workloads import get_workload

SGD = peakcut.SGD(lr=1e-2, momentum=0.9)
LIMITS = (0, 1, 2, 5, 16, 32, 1000)
KINDS = RULES.rewrite_kinds
SUBSETS = (KINDS, ("merge_matmuls",), ("split_matmul", "drop_identity"),
           ("fold_views", "merge_matmuls", "cancel_transposes"),
           ("drop_identity", "split_matmul", "drop_identity"))
WHY_NOT = {"drop_identity": (algebra.why_not_drop_identity, algebra.IDENTITY_OPS),
           "cancel_transposes": (algebra.why_not_cancel_transposes, algebra.TRANSPOSES),
           "fold_views": (algebra.why_not_fold_views, algebra.VIEWS)}


def _eager_found(g: Graph, order: Sequence[int], kind: str) -> list[RewriteSite]:
    """Every site of `kind`, each validated with the public why_not_* (order checked too)."""
    out: list[RewriteSite] = []
    if kind not in (*WHY_NOT, "merge_matmuls", "split_matmul"):   # not TASO rules: few sites
        return list(RULES.rewrite_rule(kind).sites(Query(g, order)))
    if kind == "merge_matmuls":
        for nodes in merge_groups(g):
            plan = matmul_merge.plan_merge(g, order, nodes)
            if not isinstance(plan, str):
                out.append(RewriteSite(kind, nodes, matmul_merge.merge_summary(g, plan)))
        return out
    if kind == "split_matmul":
        merged, plain = [], []
        for nid in g.order:
            if g.nodes[nid].op not in matmul.MATMULS:
                continue
            m = matmul.parse_matmul(g, nid)
            if isinstance(m, str):
                continue
            info = matmul_merge.merged_info(g, nid)
            if info is not None:
                if matmul_split.why_not_split_matmul(g, order, nid) is None:
                    k = len(info.sizes)
                    merged.append(RewriteSite(kind, (nid,), (
                        f"un-merge {describe_node(g, nid)} into {k} matmuls: "
                        f"1 matmul launch becomes {k}, its concatenations go")))
            elif g.tensors[m.out].shape[-1] >= 2 and (
                    matmul_split.why_not_split_matmul(g, order, nid, 2) is None):
                nbytes = g.tensors[m.out].nbytes
                parts = matmul_split.near_equal_parts(g.tensors[m.out].shape[-1], 2)
                plain.append((-nbytes, RewriteSite(
                    kind, (nid,), f"split {describe_node(g, nid)} into {list(parts)} output "
                    "features: 1 matmul launch becomes 2, plus weight slices and a cat of "
                    f"the {nbytes:,}-byte result", parts)))
        return merged + [c for _, c in sorted(plain, key=lambda p: p[0])]
    why_not, ops = WHY_NOT[kind]
    for nid in g.order:
        if g.nodes[nid].op in ops and why_not(g, order, nid) is None:
            effect = ("no kernel changes (views only)" if is_view_op(g.nodes[nid].op)
                      else "one elementwise kernel fewer")
            out.append(RewriteSite(kind, (nid,), f"{kind} at {describe_node(g, nid)}: {effect}"))
    if kind == "drop_identity":
        out.sort(key=lambda c: is_view_op(g.nodes[c.nodes[0]].op))
    return out


def eager_candidates(g: Graph, order: Sequence[int], limit: int,
                     kinds: Sequence[str] = KINDS) -> list[RewriteSite]:
    """The eager reference: all sites of every kind, then interleaved up to `limit`."""
    per_kind = [_eager_found(g, order, k) for k in dict.fromkeys(kinds)]
    out: list[RewriteSite] = []
    for i in range(max((len(c) for c in per_kind), default=0)):
        for found in per_kind:
            if i < len(found) and len(out) < limit:
                out.append(found[i])
    return out


def _same_for_all_queries(g: Graph, order: Sequence[int]) -> None:
    for kinds in SUBSETS:
        everything = eager_candidates(g, order, 10**9, kinds)
        for limit in LIMITS:
            assert RULES.rewrite_candidates(g, order, limit, kinds) == everything[:limit], (kinds, limit)


@pytest.fixture(scope="module", params=["bert-base", "vit-base", "gpt-neo-1.3b", "btlm-3b",
                                        "resnet50"])
def tiny(request) -> Graph:
    inst = get_workload(request.param).build("tiny")
    return peakcut.capture(inst.model, inst.batch, inst.loss_fn, SGD, keep_grads=True)


def test_lazy_matches_eager(tiny):
    _same_for_all_queries(tiny, list(tiny.order))


def test_lazy_matches_eager_on_a_detached_loss_graph(tiny):
    base = detach_loss(tiny)
    _same_for_all_queries(base, list(base.order))


def test_lazy_matches_eager_with_merged_matmuls(tiny):
    """After some merges the un-merge sites come first among split_matmul's."""
    g, order = tiny, list(tiny.order)
    for c in RULES.rewrite_candidates(g, order, limit=3, kinds=("merge_matmuls",)):
        if matmul_merge.why_not_merge_matmuls(g, order, c.nodes) is None:
            rw = RULES.apply_rewrite(g, order, c)
            g, order = rw.graph, rw.order
    _same_for_all_queries(g, order)
    everything = RULES.rewrite_candidates(g, order, 10**9, ("split_matmul",))
    merged = [c for c in everything if not c.params]
    assert everything[:len(merged)] == merged
    if g is not tiny:
        assert merged


def test_checked_skips_only_the_order_test(tiny):
    """why_not_*(checked=True) answers as the default on a matching order."""
    g, order = tiny, list(tiny.order)
    for kind, (why_not, ops) in WHY_NOT.items():
        for nid in g.order:
            if g.nodes[nid].op in ops:
                assert why_not(g, order, nid) == why_not(g, order, nid, checked=True), kind
    for nid in g.order:
        if g.nodes[nid].op in matmul.MATMULS:
            assert (matmul_split.why_not_split_matmul(g, order, nid, 2)
                    == matmul_split.why_not_split_matmul(g, order, nid, 2, checked=True))
    for nodes in merge_groups(g):
        assert (matmul_merge.plan_merge(g, order, nodes)
                == matmul_merge.plan_merge(g, order, nodes, checked=True))
