"""Attention's scores recomputed for the backward (transform/attention.py,
rules/attention_rule.py), and the head-and-loss fission region (fission/head.py).

Covered:
- one unit per layer on the tiny transformers, from the scores' matmul to the softmax and the
  views (and cast) the backward reads; none on a CNN;
- recomputed, the backward reads no tensor of a forward softmax, the simulated peak is below
  the plain step's, the measured one (CPU profiler) within the spine's 5%, and 3 AdamW steps
  give eager's loss and parameters;
- the rule offers every unit and the first half, and undoing it (uncheckpoint_blocks) gives
  the plain step's peak again;
- the head-and-loss region is an F-Tree node of a language model's step (loss, head and their
  backward, nothing of the layers), and split in 4 parts it keeps eager's numbers.
"""

from __future__ import annotations

import copy

import pytest
import torch

import peakcut
from peakcut.fission.build import find_ftree
from peakcut.fission.expand import expand
from peakcut.fission.loss import detach_loss
from peakcut.ir.node import Phase
from peakcut.memory import simulate
from peakcut.rules.attention_rule import RecomputeAttentionRule
from peakcut.rules.query import Query
from peakcut.transform.attention import SOFTMAX_OPS, attention_units
from peakcut.transform.checkpoint import checkpoint_blocks, checkpointed_blocks, uncheckpoint_blocks
from peakcut.workloads import get_workload
from tests.rules.test_offload_param import assert_close, eager_step
from tests.tolerance import tolerance

STEPS = 3
LAYERS = {"bert-base": 2, "gpt-neo-1.3b": 2, "vit-base": 2}


def _captured(name: str):
    inst = get_workload(name).build("tiny")
    model, ref = inst.model, copy.deepcopy(inst.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    return inst, (model, opt), (ref, ref_opt), peakcut.capture(model, inst.batch, inst.loss_fn, opt)


def _trains_like_eager(inst, g, order, ours, eager, plain) -> None:
    (model, opt), (ref, ref_opt) = ours, eager
    simulated = simulate(g, order).peak_bytes
    assert simulated < simulate(plain, plain.order).peak_bytes
    step = peakcut.build(g, order, optimizer=opt)
    measured = peakcut.measure(step, model, inst.batch, method="cpu-profiler", repeats=1).peak_bytes
    assert abs(simulated - measured) <= 0.05 * measured, (simulated, measured)
    tol = tolerance(torch.float32, max(256, inst.batch[0].numel()), STEPS)
    for k in range(STEPS):
        assert_close(step(model, inst.batch), eager_step(ref, ref_opt, inst.batch, inst.loss_fn), f"loss {k}", tol)
    for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_close(p, q, pname, tol)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_recomputed_scores_keep_eager_numbers(name: str) -> None:
    inst, ours, eager, plain = _captured(name)
    units = attention_units(plain)
    assert len(units) == LAYERS[name]
    for unit in units:
        ops = [plain.nodes[v].op for v in unit.nodes]
        assert any(op in SOFTMAX_OPS for op in ops) and ops[0] in ("aten.bmm.default", "aten.mm.default")
    rw, reasons = checkpoint_blocks(plain, plain.order, units)
    assert rw is not None and reasons == [None] * len(units), reasons
    g = rw.graph
    softmaxes = [v for v in g.nodes if g.nodes[v].op in SOFTMAX_OPS and g.nodes[v].phase is Phase.FORWARD
                 and v in plain.nodes]
    for v in softmaxes:   # only the forward reads the forward's scores now (through views)
        frontier, seen = list(g.nodes[v].output_ids()), set()
        while frontier:
            t = frontier.pop()
            for u in g.users(t):
                assert g.nodes[u].phase is Phase.FORWARD, (name, g.nodes[u].op)
                if u not in seen:
                    seen.add(u)
                    if any(g.tensors[o].storage == g.tensors[t].storage for o in g.nodes[u].output_ids()):
                        frontier.extend(g.nodes[u].output_ids())
    _trains_like_eager(inst, g, rw.order, ours, eager, plain)


def test_no_units_without_attention() -> None:
    inst = get_workload("resnet50").build("tiny")
    assert attention_units(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")) == []


def test_the_rule_offers_all_and_half_and_is_undone() -> None:
    inst = get_workload("gpt2-xl").build("tiny")
    plain = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    rule = RecomputeAttentionRule()
    sites = list(rule.sites(Query(plain, plain.order)))
    units = attention_units(plain)
    assert [len(s.nodes) for s in sites] == [sum(len(u.nodes) for u in units)] + (
        [sum(len(u.nodes) for u in units[:len(units) // 2])] if len(units) >= 4 else [])
    rw = rule.apply(plain, plain.order, sites[0])
    assert simulate(rw.graph, rw.order).peak_bytes < simulate(plain, plain.order).peak_bytes
    assert list(rule.sites(Query(rw.graph, rw.order))) == []       # nothing left to recompute
    modules = [m for ms in checkpointed_blocks(rw.graph).values() for m in ms]
    undone, reasons = uncheckpoint_blocks(rw.graph, rw.order, modules)
    assert undone is not None and reasons == [None] * len(modules)
    assert simulate(undone.graph, undone.order).peak_bytes == simulate(plain, plain.order).peak_bytes


def test_the_head_and_loss_region_splits_like_eager() -> None:
    inst, ours, eager, captured = _captured("bert-base")
    plain = detach_loss(captured)
    tree, dgraph = find_ftree(plain, plain.order, batch_only=True)
    loss = [v for v in plain.order if plain.nodes[v].phase is Phase.LOSS]
    heads = [f for f in tree.nodes if set(loss) & f.nodes
             and {plain.nodes[v].phase for v in f.nodes} >= {Phase.FORWARD, Phase.LOSS, Phase.BACKWARD}
             and not any(plain.nodes[v].module.startswith("bert.encoder") for v in f.nodes)]
    assert heads, "no head-and-loss region in the F-Tree"
    head = min(heads, key=lambda f: len(f.nodes))
    split = expand(plain, plain.order, tree.with_n(head.id, 4), dgraph)
    _trains_like_eager(inst, split.graph, split.order, ours, eager, plain)
