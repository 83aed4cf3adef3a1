"""TASO-style rewrites: merging matmuls that share an operand (forward QKV, backward weight
gradients) or whose results are summed (backward input gradients), splitting / un-merging
them, and the algebraic simplifications that fire on the workloads.

Every rewrite is checked for: the input graph untouched; added / changed / removed exactly the
nodes whose existence, arguments or control edges differ; a valid order; and (once per
composed sequence) Graph.check, simulation and the same numbers as eager PyTorch over two
steps (fp32, rtol 1e-5 / atol 1e-6).
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.transform.rewrite import RuleError, ancestors
from peakcut.transform.taso import (
    cancel_transposes,
    drop_identity,
    fold_views,
    merge_groups,
    merge_matmuls,
    split_matmul,
    why_not_cancel_transposes,
    why_not_drop_identity,
    why_not_fold_views,
    why_not_merge_matmuls,
    why_not_split_matmul,
)
from peakcut.transform.taso.edit import shape_check
from peakcut.transform.taso.tag import TasoTag
from peakcut.workloads import get_workload
from tests.transform.conftest import random_topological_order

ADAMW = peakcut.AdamW(lr=1e-3, weight_decay=1e-2)
SGD = peakcut.SGD(lr=1e-2, momentum=0.9)
ALGEBRA = ("drop_identity", "cancel_transposes", "fold_views")


# ---------------------------------------------------------------- helpers
def snapshot(g):
    return (dict(g.nodes), dict(g.tensors), dict(g.control), list(g.order), dict(g.storages),
            list(g.inputs), list(g.outputs))


def checked(g, order, rw, full=False):
    """The Rewrite's bookkeeping is exact and its orders are valid; `full`: also check()."""
    new = rw.graph
    added, removed, changed = set(rw.added), set(rw.removed), set(rw.changed)
    assert added.isdisjoint(g.nodes) and added <= set(new.nodes)
    assert removed <= set(g.nodes) and removed.isdisjoint(new.nodes)
    assert set(new.nodes) == (set(g.nodes) - removed) | added
    differ = {n for n in set(g.nodes) & set(new.nodes)
              if (g.nodes[n].args, g.nodes[n].kwargs) != (new.nodes[n].args, new.nodes[n].kwargs)
              or set(g.control.get(n, ())) != set(new.control.get(n, ()))}
    assert differ == changed, (sorted(differ - changed), sorted(changed - differ))
    for o in (rw.order, new.order):
        pos = {n: i for i, n in enumerate(o)}
        assert len(pos) == len(new.nodes)
        assert all(pos[p] < pos[n] for n in new.nodes for p in new.predecessors(n))
    assert set(rw.order) == set(order) - removed | added
    storages = {t.storage for t in new.tensors.values()}
    assert storages == set(new.storages), "storages without tensors, or tensors without one"
    if full:
        check_graph(new)
        simulate(new, rw.order)
    return rw


def apply(rule, g, order, *args, **kw):
    before = snapshot(g)
    rw = checked(g, order, rule(g, order, *args, **kw))
    assert snapshot(g) == before, "the rule modified its input graph"
    return rw


def by_name(g, name):
    return next(n for n in g.nodes.values() if n.name == name).id


def numbers(inst, spec, g, order, **tol):
    report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, spec,
                                       lambda _m: Step(g, order), steps=2, **tol)
    assert report.ok, str(report)
    return report


def merged_mode(g: Graph, nid: int) -> str | None:
    """The merge mode of a matmul merge_matmuls made (None for any other node)."""
    tag = g.nodes[nid].tags.get(TasoTag)
    return tag.mode if tag is not None else None


def mode_of(rw):
    return next(tag.mode for a in rw.added
                if (tag := rw.graph.nodes[a].tags.get(TasoTag)) is not None and tag.mode is not None)


@pytest.fixture(scope="module")
def bert():
    inst = get_workload("bert-base").build("tiny")
    return inst, peakcut.capture(inst.model, inst.batch, inst.loss_fn, ADAMW)


# ---------------------------------------------------------------- merge_matmuls
def test_forward_qkv_merge(bert):
    _, g = bert
    qkv = [by_name(g, n) for n in ("addmm", "addmm_1", "addmm_2")]
    assert why_not_merge_matmuls(g, g.order, qkv) is None
    rw = apply(merge_matmuls, g, g.order, qkv)
    new = rw.graph
    ops = [new.nodes[a].op for a in rw.added]
    assert ops == ["aten.cat.default", "aten.t.default", "aten.cat.default",
                   "aten.addmm.default", "aten.split_with_sizes.default"]
    assert set(rw.removed) == set(qkv)
    wcat, _, bcat, merged, split = (new.nodes[a] for a in rw.added)
    # the weights are concatenated as stored (rows of W), the matmul keeps t(W)
    weights = [g.nodes[g.producer(g.nodes[n].args[2].id)].args[0].id for n in qkv]
    assert [r.id for r in wcat.args[0]] == weights
    assert [r.id for r in bcat.args[0]] == [g.nodes[n].args[0].id for n in qkv]
    out = new.tensors[merged.outputs[0]]
    assert (out.shape, out.stride, out.storage_offset) == ((128, 192), (192, 1), 0)
    assert new.storages[out.storage] == 128 * 192 * 4
    parts = [new.tensors[t] for t in split.outputs]
    assert [(p.shape, p.stride, p.storage_offset, p.storage) for p in parts] == [
        ((128, 64), (192, 1), off, out.storage) for off in (0, 64, 128)]
    # readers' views follow into the merged storage with the new strides
    view = new.tensors[new.nodes[by_name(g, "view_1")].outputs[0]]
    assert (view.storage, view.shape, view.stride) == (out.storage, (4, 32, 64), (6144, 192, 1))
    for n in qkv:
        assert g.tensors[g.nodes[n].outputs[0]].storage not in new.storages
    assert merged.tags.get(TasoTag) == TasoTag("merge_matmuls", mode="cols", sizes=(64, 64, 64),
                                       merged=("addmm", "addmm_1", "addmm_2"))
    assert merged.module == "bert.encoder.layer.0.attention.self"
    assert "3 matmul launches become 1" in rw.description
    shape_check(new, rw.added)


def test_merged_weights_are_read_before_their_update(bert):
    _, g = bert
    qkv = [by_name(g, n) for n in ("addmm", "addmm_1", "addmm_2")]
    for order in (g.order, random_topological_order(g, seed=5)):
        rw = apply(merge_matmuls, g, order, qkv)
        new = rw.graph
        pos = {n: i for i, n in enumerate(rw.order)}
        cats = [a for a in rw.added if new.nodes[a].op == "aten.cat.default"]
        writers = 0
        for cat in cats:
            read = {new.tensors[t].storage for t in new.nodes[cat].input_ids()}
            assert read <= new.caller_held_storages()       # parameters, read directly
            for nid in new.nodes:
                written = {new.tensors[t].storage for t in new.mutated_tensors(nid)}
                if written & read:
                    writers += 1
                    assert new.nodes[nid].phase.value == "optimizer"
                    assert cat in ancestors(new, nid), new.nodes[nid].name
                    assert pos[cat] < pos[nid]
        assert writers >= 12   # AdamW writes each weight and bias twice (decay, update)


def test_backward_merges(bert):
    _, g = bert
    groups = {tuple(g.nodes[n].name for n in grp): grp for grp in merge_groups(g)}
    rows = groups[("mm_23", "mm_25", "mm_27")]      # G^T @ X for the q, k, v weights
    sums = groups[("mm_22", "mm_24", "mm_26")]      # G @ W summed into the input gradient
    rw = apply(merge_matmuls, g, g.order, rows)
    assert mode_of(rw) == "rows"
    merged = next(rw.graph.nodes[a] for a in rw.added if a not in rw.graph.nodes or
                  rw.graph.nodes[a].op == "aten.mm.default")
    assert rw.graph.tensors[merged.outputs[0]].shape == (192, 64)
    # the transposed gradients are concatenated before the transpose: t(cat(G_i, 1))
    lhs = rw.graph.nodes[rw.graph.producer(merged.args[0].id)]
    assert lhs.op == "aten.t.default"
    assert rw.graph.nodes[rw.graph.producer(lhs.args[0].id)].op == "aten.cat.default"

    rw = apply(merge_matmuls, g, g.order, sums)
    assert mode_of(rw) == "sum"
    new = rw.graph
    assert {g.nodes[n].name for n in rw.removed} >= {"mm_22", "mm_24", "mm_26", "add_15",
                                                      "add_16"}
    root = new.nodes[by_name(g, "add_17")]      # still adds the residual gradient
    assert root.args[0].id == g.nodes[by_name(g, "add_15")].args[0].id
    view = new.nodes[new.producer(root.args[1].id)]
    mm = new.nodes[new.producer(view.args[0].id)]
    assert (mm.op, new.tensors[mm.outputs[0]].shape) == ("aten.mm.default", (128, 64))
    assert [new.tensors[a.id].shape for a in mm.args] == [(128, 192), (192, 64)]
    assert by_name(g, "add_17") in rw.changed


class Chained(nn.Module):
    """x @ w and x @ (y1^T @ x): they share x, but the second depends on the first."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y1 = x @ self.w
        return x @ (y1.t() @ x)


class WriteBetween(nn.Module):
    """h is written in place between the two matmuls reading it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("b1", torch.randn(8, 8))
        self.register_buffer("b2", torch.randn(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        y1 = h @ self.b1
        h.mul_(2)
        return y1 + h @ self.b2


def _small(module):
    torch.manual_seed(0)
    return peakcut.capture(module(), (torch.randn(4, 8),),
                           lambda m, b: m(b[0]).square().mean(), "adamw")


def test_merge_refusals(bert):
    _, g = bert
    q, k = by_name(g, "addmm"), by_name(g, "addmm_1")
    cases = [
        ([q], "at least two"),
        ([q, by_name(g, "view")], "not a matmul"),
        ([q, by_name(g, "mm_23")], "mix aten.mm and aten.addmm"),
        ([by_name(g, "mm_23"), by_name(g, "mm_22")], "share no operand"),
        ([q, by_name(g, "addmm_4")], "share no operand"),
    ]
    for nodes, reason in cases:
        assert reason in why_not_merge_matmuls(g, g.order, nodes)
        with pytest.raises(RuleError, match=reason):
            merge_matmuls(g, g.order, nodes)
    assert "stale order" in why_not_merge_matmuls(g, g.order[:-1], [q, k])
    chained = _small(Chained)
    grp = next(grp for grp in merge_groups(chained) if len(grp) == 3)
    assert "one merged matmul would depend on itself" in why_not_merge_matmuls(
        chained, chained.order, grp)
    written = _small(WriteBetween)
    first, second = merge_groups(written)
    assert "do not read the same values" in why_not_merge_matmuls(written, written.order, first)
    assert why_not_merge_matmuls(written, written.order, second) is None   # its backward


# ---------------------------------------------------------------- split_matmul
def test_unmerge_restores_the_graph(bert):
    _, g = bert
    order = list(g.order)
    cur = g
    for grp in merge_groups(g):
        rw = apply(merge_matmuls, cur, order, grp)
        cur, order = rw.graph, rw.order
    assert sum(n.op == "aten.split_with_sizes.default" for n in cur.nodes.values()) == 4
    merged = [n for n in order if cur.nodes[n].op in ("aten.mm.default", "aten.addmm.default")
              and cur.nodes[n].tags.get(TasoTag) is not None]
    assert len(merged) == 6
    for nid in merged:
        assert why_not_split_matmul(cur, order, nid) is None
        rw = apply(split_matmul, cur, order, nid)
        assert "un-merge" in rw.description
        cur, order = rw.graph, rw.order
    count = collections.Counter(n.op for n in cur.nodes.values())
    original = collections.Counter(n.op for n in g.nodes.values())
    for op in ("aten.mm.default", "aten.addmm.default", "aten.cat.default",
               "aten.split_with_sizes.default", "aten.add.Tensor"):
        assert count[op] == original[op], op
    check_graph(cur)
    assert simulate(cur, order).peak_bytes == simulate(g, g.order).peak_bytes


def test_split_output_features(bert):
    _, g = bert
    dense = by_name(g, "addmm_4")                 # intermediate.dense, 64 -> 128 features
    rw = apply(split_matmul, g, g.order, dense, [32, 96])
    new = rw.graph
    mms = [new.nodes[a] for a in rw.added if new.nodes[a].op == "aten.addmm.default"]
    assert [new.tensors[m.outputs[0]].shape for m in mms] == [(128, 32), (128, 96)]
    cat = next(new.nodes[a] for a in rw.added if new.nodes[a].op == "aten.cat.default")
    old, out = g.tensors[g.nodes[dense].outputs[0]], new.tensors[cat.outputs[0]]
    assert (out.shape, out.stride) == (old.shape, old.stride)
    assert "1 matmul launch becomes 2" in rw.description
    assert len(apply(split_matmul, g, g.order, dense, 3).added) >= 4
    qkv = apply(merge_matmuls, g, g.order, [by_name(g, n) for n in ("addmm", "addmm_1",
                                                                      "addmm_2")])
    merged = next(a for a in qkv.added if qkv.graph.nodes[a].op == "aten.addmm.default")
    halves = apply(split_matmul, qkv.graph, qkv.order, merged, 2)     # parts: a plain split
    assert "into 2 matmuls [96, 96] and a cat" in halves.description
    assert "cannot split" in why_not_split_matmul(g, g.order, dense, [64, 65])
    assert "cannot split" in why_not_split_matmul(g, g.order, dense, 1)
    assert "not a matmul" in why_not_split_matmul(g, g.order, by_name(g, "view"))


# ---------------------------------------------------------------- algebra
def test_cancel_transposes(bert):
    _, g = bert
    outer = by_name(g, "t_58")           # t(t(W_v)): the backward reads W_v
    inner = g.producer(g.nodes[outer].args[0].id)
    weight = g.nodes[inner].args[0].id
    rw = apply(cancel_transposes, g, g.order, outer)
    assert rw.removed == (outer,)        # the inner t still feeds the forward addmm
    assert rw.graph.nodes[by_name(g, "mm_22")].args[1].id == weight
    assert "grad tensor" in why_not_cancel_transposes(g, g.order, by_name(g, "t_61"))
    assert "do not undo each other" in why_not_cancel_transposes(
        g, g.order, by_name(g, "transpose_3"))
    assert "not the result of a transpose" in why_not_cancel_transposes(
        g, g.order, by_name(g, "t")).replace("does not transpose", "not")
    with pytest.raises(RuleError, match="is not one of"):
        cancel_transposes(g, g.order, by_name(g, "addmm"))


def test_fold_views_and_identities(bert):
    _, g = bert
    outer = by_name(g, "view_2")         # view(view(addmm, [4, 32, 64]), [4, 32, -1, 16])
    rw = apply(fold_views, g, g.order, outer)
    assert rw.graph.nodes[outer].args[0].id == g.nodes[by_name(g, "addmm")].outputs[0]
    assert rw.changed == (outer,) and rw.removed == (by_name(g, "view_1"),)
    assert "1 view node(s) fewer" in rw.description
    assert "does not view the result of a view" in why_not_fold_views(g, g.order,
                                                                       by_name(g, "view"))
    add = by_name(g, "add_2")            # arange(32) + 0
    arange = g.nodes[add].args[0].id
    rw = apply(drop_identity, g, g.order, add)
    assert rw.removed == (add,)
    (user,) = rw.changed
    assert rw.graph.nodes[user].args[0].id == arange
    assert "one elementwise kernel" in rw.description
    assert "does not mul the scalar 1" in why_not_drop_identity(g, g.order, by_name(g, "mul"))
    assert why_not_drop_identity(g, g.order, by_name(g, "detach")) is None
    for name in ("expand_3", "detach_42"):
        rw = apply(drop_identity, g, g.order, by_name(g, name))
        assert rw.removed == (by_name(g, name),)


def test_shape_check_catches_a_wrong_meta(bert):
    _, g = bert
    edit = GraphEditor(g)
    t = g.nodes[by_name(g, "addmm")].outputs[0]
    m = g.tensors[t]
    edit.set_tensor(TensorMeta(t, (128, 65), m.stride, m.dtype, m.storage, 0, Role.ACTIVATION))
    bad = edit.finish()
    with pytest.raises(RuleError, match="shape check: node addmm"):
        shape_check(bad, [by_name(g, "addmm")])


# ---------------------------------------------------------------- candidates
def test_candidates_are_deterministic_bounded_and_apply(bert):
    _, g = bert
    everything = RULES.rewrite_candidates(g, g.order, limit=10**6)
    assert everything == RULES.rewrite_candidates(g.copy(), list(g.order), limit=10**6)
    count = collections.Counter(c.kind for c in everything)
    assert count["merge_matmuls"] == 6
    assert count["drop_identity"] > 0 and count["cancel_transposes"] > 0
    assert count["fold_views"] > 0 and count["split_matmul"] > 0
    first = RULES.rewrite_candidates(g, g.order, limit=5)
    assert [c.kind for c in first] == [k for k in RULES.rewrite_kinds if count[k]][:5]
    assert RULES.rewrite_candidates(g, g.order, limit=3, kinds=("merge_matmuls",)) == [
        c for c in everything if c.kind == "merge_matmuls"][:3]
    assert all(c.description for c in everything)
    for c in first:
        checked(g, g.order, RULES.apply_rewrite(g, g.order, c))
    with pytest.raises(ValueError, match="unknown TASO candidate kinds"):
        RULES.rewrite_candidates(g, g.order, kinds=("fuse",))
    with pytest.raises(ValueError, match="limit"):
        RULES.rewrite_candidates(g, g.order, limit=-1)
    with pytest.raises(ValueError, match="stale order"):
        RULES.rewrite_candidates(g, g.order[1:])


# ---------------------------------------------------------------- numbers on the workloads
# merge sites per tiny workload: transformers have 3 per layer (forward QKV or gated-MLP
# projections, backward weight gradients, backward input-gradient sum), 2 layers each
MERGES = {"resnet50": 0, "bert-base": 6, "vit-base": 6, "gpt-neo-1.3b": 6, "btlm-3b": 6}


def compose(g, order, kinds):
    """Apply every candidate of `kinds` (found once per kind), checking each rewrite."""
    done = collections.Counter()
    for kind in kinds:
        for c in RULES.rewrite_candidates(g, order, limit=10**6, kinds=(kind,)):
            rw = checked(g, order, RULES.apply_rewrite(g, order, c))
            g, order = rw.graph, rw.order
            done[kind] += 1
    return g, order, done


@pytest.mark.parametrize("name", list(MERGES))
def test_all_rules_keep_the_numbers(name):
    """All merges and algebraic rewrites composed, then one un-merge and one split: the step
    gives eager PyTorch's numbers (SGD: AdamW's normalized update turns the rounding noise of
    a reassociated sum in mathematically-zero gradients, the key biases', into lr-sized
    differences)."""
    inst = get_workload(name).build("tiny")
    g0 = peakcut.capture(inst.model, inst.batch, inst.loss_fn, SGD, keep_grads=True)
    g, order, done = compose(g0, list(g0.order), ("merge_matmuls", *ALGEBRA))
    assert done["merge_matmuls"] == MERGES[name]
    assert done["drop_identity"] > 0
    if MERGES[name]:
        merged = next(n for n in order if merged_mode(g, n) is not None)
        rw = checked(g, order, split_matmul(g, order, merged))
        g, order = rw.graph, rw.order
    plain = next(n for n in order if g.nodes[n].op in ("aten.mm.default", "aten.addmm.default")
                 and g.nodes[n].tags.get(TasoTag) is None and g.nodes[n].phase.value == "backward")
    rw = checked(g, order, split_matmul(g, order, plain), full=True)
    g, order = rw.graph, rw.order
    assert len(g.nodes) < len(g0.nodes)
    numbers(inst, SGD, g, order, rtol=1e-5, atol=1e-6)


def test_matmul_merges_keep_adamw_numbers(bert):
    """Merges that share an operand compute every output element as the same dot product:
    even AdamW's steps match at fp32 tolerance."""
    inst, _ = bert
    g0 = peakcut.capture(inst.model, inst.batch, inst.loss_fn, ADAMW, keep_grads=True)
    g, order = g0, list(g0.order)
    for grp in merge_groups(g0):
        if why_not_merge_matmuls(g, order, grp) is None:
            rw = merge_matmuls(g, order, grp)
            if mode_of(rw) != "sum":
                g, order = rw.graph, rw.order
    assert sum(merged_mode(g, n) is not None for n in g.nodes) == 4
    check_graph(g)
    numbers(inst, ADAMW, g, order, rtol=1e-5, atol=1e-6)
