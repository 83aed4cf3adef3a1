"""Checkpointing repeated blocks (transform/checkpoint/, rules/checkpoint_rule.py).

Covered:
- the blocks of the tiny models are found by module path: the transformers' layer lists,
  ResNet-50's bottlenecks across stages, U-Net's encoder and decoder stages, U-Net++'s nodes;
- every block checkpointed, each trains like eager over 3 AdamW steps (loss, parameters,
  buffers: the CNNs' batch norms are recomputed without their running statistics, which are
  updated once, as in eager), its simulated peak is below the plain step's and within 5% of
  the measured one (CPU profiler);
- a block whose forward draws random numbers (dropout) is refused, naming the node;
- every in-place writer of a storage a recompute reads (the optimizer's update of a
  parameter) runs after the recompute (control edge), in the order and in the graph;
- a block checkpointed once has no site left;
- undone (uncheckpoint_blocks): the step's peak is the plain step's again, half undone it lies
  between, and both keep eager's numbers with measured peaks within 5% of the simulated ones;
- inside an enabled fission region (the search's move): the region carries over to the new
  base, the program's peak is below the split's alone, and it keeps eager's numbers;
- with every update on the host and every parameter in host memory (the plan the search
  finds for Llama-2-7B at 24 GB), at tiny size: eager's numbers, measured peak within 5% of the simulated one (assert_tiny_plan_trains_like_eager).
"""

from __future__ import annotations

import copy
import random

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.cost import get_cost_model
from peakcut.ir.tags import RematTag
from peakcut.ir.tensor import Role
from peakcut.memory import simulate
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import MoveSettings, children
from peakcut.optimizer.derive import Deriver
from peakcut.rules import RULES
from peakcut.rules.hotspot import HotspotSite
from peakcut.transform.checkpoint import (
    checkpoint_blocks,
    checkpointed_blocks,
    find_blocks,
    uncheckpoint_blocks,
    why_not_checkpoint,
)
from peakcut.transform.rewrite import positions
from peakcut.workloads import get_workload
from tests.helpers import cross_entropy_loss, in_float64
from tests.rules.test_offload_param import (
    assert_close,
    assert_tiny_plan_trains_like_eager,
    eager_step,
)
from tests.tolerance import tolerance

STEPS = 3


def _assert_measured_near(measured: int, simulated: int) -> None:
    """The spine's tolerance (5%): equal to the byte on the CPU these figures were made on,
    but another CPU's kernels may take other scratch memory than the calibrated model says."""
    assert abs(simulated - measured) <= 0.05 * measured, (simulated, measured)


def _checkpointed(g: peakcut.ir.graph.Graph):
    (blocks,) = find_blocks(g).values()
    rw, reasons = checkpoint_blocks(g, g.order, blocks)
    assert rw is not None and reasons == [None] * len(blocks), reasons
    return rw


BLOCKS = {"bert-base": {"bert.encoder.layer": 2}, "gpt2-xl": {"transformer.h": 2}, "llama2-7b": {"model.layers": 2},
          "resnet50": {"layer#": 4}, "unet": {"downs": 3, "up_convs": 3}, "unetpp": {"nodes.x#_#": 10}}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_a_checkpointed_model_keeps_eager_numbers(name: str) -> None:
    """Every block list checkpointed: eager's loss, parameters and buffers (the CNNs' running
    statistics, updated once per step although their batch norms run twice)."""
    inst = get_workload(name).build("tiny")
    model, ref = inst.model, copy.deepcopy(inst.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    plain = peakcut.capture(model, inst.batch, inst.loss_fn, opt)
    found = find_blocks(plain)
    assert {k: len(v) for k, v in found.items()} == BLOCKS[name]
    g, order = plain, plain.order
    for blocks in found.values():
        rw, reasons = checkpoint_blocks(g, order, blocks)
        assert rw is not None and reasons == [None] * len(blocks), reasons
        g, order = rw.graph, rw.order
    simulated = simulate(g, order).peak_bytes
    assert simulated < simulate(plain, plain.order).peak_bytes
    step = peakcut.build(g, order, optimizer=opt)
    assert "# recompute of" in step.source
    _assert_measured_near(peakcut.measure(step, model, inst.batch, method="cpu-profiler", repeats=1).peak_bytes,
                          simulated)
    tol = tolerance(torch.float32, max(256, inst.batch[0].numel()), STEPS)
    for k in range(STEPS):
        assert_close(step(model, inst.batch), eager_step(ref, ref_opt, inst.batch, inst.loss_fn), f"loss {k}", tol)
    for (pname, p), q in zip(model.state_dict().items(), ref.state_dict().values(), strict=True):
        assert_close(p, q, pname, tol)


def test_a_training_batch_norm_is_recomputed_without_its_running_statistics() -> None:
    inst = get_workload("resnet50").build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    rw = _checkpointed(g)
    copies = [v for v in rw.added if rw.graph.nodes[v].op == "aten.native_batch_norm.default"]
    assert copies and all(rw.graph.nodes[v].args[3:5] == (None, None) for v in copies)
    assert not any(rw.graph.mutated_tensors(v) for v in copies)


class _Block(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.linear(x)))


class _Stack(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block(dropout) for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _stack(dropout: float) -> tuple[_Stack, peakcut.ir.graph.Graph]:
    torch.manual_seed(0)
    model = _Stack(dropout)
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    return model, peakcut.capture(model, batch, cross_entropy_loss, "adamw")


def test_a_block_that_draws_random_numbers_is_refused() -> None:
    _, g = _stack(0.1)
    blocks = find_blocks(g)["layers"]
    reason = why_not_checkpoint(g, g.order, blocks[0])
    assert reason is not None and "random" in reason and "layers.0" in reason
    assert not [s for s in RULES.rewrite_candidates(g, g.order, kinds=["checkpoint_blocks"])]


def test_parameter_updates_wait_for_the_recomputes_that_read_them() -> None:
    _, g = _stack(0.0)
    rw = _checkpointed(g)
    new, pos = rw.graph, positions(rw.order)
    copies = [v for v in rw.added if new.nodes[v].tags.get(RematTag) is not None]
    guarded = 0
    for c in copies:
        for t in new.nodes[c].input_ids():
            for m in new.storage_writers(new.tensors[t].storage):
                assert c in new.control.get(m, ()), (new.nodes[c].name, new.nodes[m].name)
                assert pos[c] < pos[m]
                guarded += 1
    assert guarded >= 3    # each block's weight and bias are read by its recompute
    assert not list(RULES.rewrite_candidates(new, rw.order, kinds=["checkpoint_blocks"]))


def test_checkpointing_inside_an_enabled_fission_region() -> None:
    spec = peakcut.AdamW(lr=1e-2)
    inst = in_float64(get_workload("llama2-7b").build("tiny"))
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, spec, keep_grads=True)
    root = optimize_graph(g, time_budget=0, device="rtx3090").result.root
    deriver = Deriver(get_cost_model("rtx3090"))
    splits = [m.build() for m in children(root, deriver, MoveSettings.only("fission"), random.Random(0))]
    split = max(splits, key=lambda s: sum(len(f.nodes) for f in s.tree.enabled()))
    (move,) = [m for m in children(split, deriver, MoveSettings.only("taso"), random.Random(0))
               if m.rule == "checkpoint_blocks"]
    state = deriver.resolve(move.build())
    assert [n for _, n in state.fission()] == [n for _, n in split.fission()]
    assert state.peak_bytes < split.peak_bytes
    full = deriver.exact(state)
    assert full.peak_bytes == state.peak_bytes
    report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, spec,
                                       lambda _m: Step(full.program, full.order), steps=2,
                                       rtol=1e-7, atol=1e-9)
    assert report.ok, report


def test_the_llm_plan_checkpoint_host_update_and_offloaded_parameters() -> None:
    """What the search ends on for Llama-2-7B at 24 GB (BENCHMARKS.md, "LLMs at full size"),
    at tiny size: every layer checkpointed, every update on the host, every parameter kept in
    host memory; eager's numbers over 3 steps with torch.optim.AdamW, measured peak and host
    buffers equal to the simulated ones."""
    inst = get_workload("llama2-7b").build("tiny")
    model, ref = inst.model, copy.deepcopy(inst.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=1e-2)
    plain = peakcut.capture(model, inst.batch, inst.loss_fn, opt)
    rw = _checkpointed(plain)
    g, order = rw.graph, rw.order
    for kind in ("host_update", "offload_param"):
        sites = [HotspotSite(t, -1, (), g.tensors[t].nbytes, 0) for t in g.inputs if g.tensors[t].role is Role.PARAM]
        done, reasons = RULES.program_rule(kind).apply_many(g, order, sites)
        assert done is not None and reasons == [None] * len(sites), (kind, reasons)
        g, order = done.graph, done.order
    assert simulate(g, order).peak_bytes < simulate(rw.graph, rw.order).peak_bytes
    assert_tiny_plan_trains_like_eager(inst, plain, g, order, (model, opt), (ref, ref_opt))


@pytest.mark.parametrize(("name", "blocks"), [
    ("llama2-7b", ["model.layers.0", "model.layers.1"]),
    ("resnet50", ["layer1", "layer2", "layer3", "layer4"]),   # one bottleneck a stage; batch norm copies go too
])
def test_undoing_the_checkpoint(name: str, blocks: list[str]) -> None:
    inst = get_workload(name).build("tiny")
    model = inst.model
    plain = peakcut.capture(model, inst.batch, inst.loss_fn, "adamw", keep_grads=True)
    done = _checkpointed(plain)
    (modules,) = checkpointed_blocks(done.graph).values()
    assert modules == blocks
    peaks = {"plain": simulate(plain, plain.order).peak_bytes,
             "checkpointed": simulate(done.graph, done.order).peak_bytes}
    for label, undo in (("half", modules[1:]), ("all", modules)):
        rw, reasons = uncheckpoint_blocks(done.graph, done.order, undo)
        assert rw is not None and reasons == [None] * len(undo), reasons
        assert not any(n.tags.get(RematTag) is not None and n.tags.get(RematTag).block in undo for n in rw.graph.nodes.values())
        assert len(rw.graph.nodes) < len(done.graph.nodes)
        peaks[label] = simulated = simulate(rw.graph, rw.order).peak_bytes
        step = peakcut.build(rw.graph, rw.order)
        _assert_measured_near(peakcut.measure(step, model, inst.batch, method="cpu-profiler", repeats=1).peak_bytes,
                              simulated)
        report = peakcut.check_equivalence(model, inst.batch, inst.loss_fn, peakcut.AdamW(),
                                           lambda _m, rw=rw: Step(rw.graph, rw.order), steps=2)
        assert report.ok, (label, report)
    assert peaks["all"] == peaks["plain"]
    assert peaks["checkpointed"] <= peaks["half"] <= peaks["plain"], peaks
    assert list(RULES.rewrite_candidates(done.graph, done.order, kinds=["uncheckpoint_blocks"]))


def test_layers_with_pytorch_s_fused_attention_are_checkpointed() -> None:
    """transformers' default attention ("sdpa") runs aten._scaled_dot_product_flash_attention_for_cpu
    on a CPU (and aten._safe_softmax where a row may be all masked): both are in the registry,
    so a layer that calls them can be recomputed, and the layers train like eager."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config)
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 16))

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return m(input_ids=batch[0], labels=batch[0]).loss

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    plain = peakcut.capture(model, (ids,), loss_fn, opt)
    assert any(n.op == "aten._scaled_dot_product_flash_attention_for_cpu.default" for n in plain.nodes.values())
    rw = _checkpointed(plain)
    step = peakcut.build(rw.graph, rw.order, optimizer=opt)
    assert "# recompute of" in step.source
    tol = tolerance(torch.float32, 32 * 16, STEPS)
    for k in range(STEPS):
        assert_close(step(model, (ids,)), eager_step(ref, ref_opt, (ids,), loss_fn), f"loss {k}", tol)
    for (pname, p), q in zip(model.state_dict().items(), ref.state_dict().values(), strict=True):
        assert_close(p, q, pname, tol)


def test_blocks_are_checkpointed_in_a_memory_aware_order() -> None:
    """A memory-aware order (here the greedy one, which optimize's re-order can return) runs a
    backward view of a saved tensor, and a parameter's weight decay (which reads no gradient),
    wherever their inputs allow: inside the block's forward, before its backward. Both were
    refusals ("runs before the forward ... ends", "writes ... in place between the forward and
    its backward"), so optimize never checkpointed a Swin block. The views are moved to their
    first reader and the writers after the copies; the step trains like eager."""
    from transformers import SwinConfig, SwinForImageClassification

    from peakcut.schedule.greedy import greedy_order
    from peakcut.schedule.problem import Problem

    torch.manual_seed(0)
    model = SwinForImageClassification(SwinConfig(
        image_size=16, patch_size=2, num_channels=3, embed_dim=8, depths=[2], num_heads=[2], window_size=4,
        mlp_ratio=2.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
        num_labels=3, attn_implementation="eager"))
    ref = copy.deepcopy(model)
    batch = (torch.randn(2, 3, 16, 16), torch.randint(0, 3, (2,)))

    def loss_fn(m: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(m(pixel_values=b[0]).logits, b[1])

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.1)
    g = peakcut.capture(model, batch, loss_fn, opt)
    problem = Problem(g, "cpu")
    order = problem.node_ids(greedy_order(problem))
    (blocks,) = find_blocks(g).values()
    assert any(why_not_checkpoint(g, g.order, b) is None for b in blocks)
    rw, reasons = checkpoint_blocks(g, order, blocks)
    assert rw is not None and reasons == [None] * len(blocks), reasons
    step = peakcut.build(rw.graph, rw.order, optimizer=opt)
    tol = tolerance(torch.float32, 2 * 64 * 8, STEPS)
    for k in range(STEPS):
        assert_close(step(model, batch), eager_step(ref, ref_opt, batch, loss_fn), f"loss {k}", tol)
    for (pname, p), q in zip(model.state_dict().items(), ref.state_dict().values(), strict=True):
        assert_close(p, q, pname, tol)
