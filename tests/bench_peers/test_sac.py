"""bench.peers.sac: torchtitan's selective checkpointing, captured as it runs eagerly."""

from __future__ import annotations

import copy
from collections import Counter

import torch

import peakcut
from bench.peers.sac import traced_as_eager
from bench.peers.simulate import capture_checkpointed, capture_selective
from bench.peers.tools import apply_selective_checkpointing
from peakcut import Graph
from peakcut.memory import simulate
from peakcut.workloads import get_workload


def _ops(g: Graph, phase: str) -> Counter[str]:
    return Counter(n.op for n in g.nodes.values() if n.phase.name == phase)


def test_selective_capture_recomputes_what_the_policy_says() -> None:
    inst = get_workload("gpt-neo-1.3b").build("tiny")
    eager = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    sac, note = capture_selective(inst)
    full, _ = capture_checkpointed(inst)
    blocks = inst.model.config.num_layers
    assert f"around {blocks} blocks" in note
    mm = "aten.mm.default"
    # per block q, k, v are bias-free mm: the second is recomputed; addmm and bmm are saved
    assert _ops(sac, "BACKWARD")[mm] == _ops(eager, "BACKWARD")[mm] + blocks
    assert _ops(sac, "BACKWARD")["aten.addmm.default"] == _ops(eager, "BACKWARD")["aten.addmm.default"]
    assert _ops(full, "BACKWARD")["aten.addmm.default"] > _ops(eager, "BACKWARD")["aten.addmm.default"]
    assert _ops(sac, "BACKWARD")["aten._softmax.default"] == blocks     # recomputed
    peak = {name: simulate(g, g.order).peak_bytes for name, g in (("eager", eager), ("sac", sac), ("full", full))}
    assert peak["full"] < peak["sac"] < peak["eager"]


def test_without_the_patch_make_fx_keeps_everything() -> None:
    # torch.utils.checkpoint takes make_fx's proxy mode for a compiler and caches every output
    inst = get_workload("gpt-neo-1.3b").build("tiny")
    model = copy.deepcopy(inst.model)
    apply_selective_checkpointing(inst.name, model)
    g = peakcut.capture(model, inst.batch, inst.loss_fn, "adamw")
    assert _ops(g, "BACKWARD")["aten._softmax.default"] == 0
    with traced_as_eager():
        g = peakcut.capture(model, inst.batch, inst.loss_fn, "adamw")
    assert _ops(g, "BACKWARD")["aten._softmax.default"] > 0


def test_selective_checkpointing_gives_eagers_gradients() -> None:
    inst = get_workload("resnet50").build("tiny")
    model = copy.deepcopy(inst.model)
    apply_selective_checkpointing(inst.name, model)
    ref = copy.deepcopy(inst.model)
    loss, ref_loss = inst.loss_fn(model, inst.batch), inst.loss_fn(ref, inst.batch)
    loss.backward()
    ref_loss.backward()
    assert torch.equal(loss, ref_loss)       # the same ops on the same inputs, recomputed
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
