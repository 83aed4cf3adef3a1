"""Checkpointing the forward ops outside the repeated blocks (transform/checkpoint_segments.py,
rules/checkpoint_segments_rule.py).

Covered:
- the segments of the tiny CNNs: a ResNet's stem and head, U-Net's input convolutions and the
  upsampling and concatenation before each decoder stage, U-Net++'s concatenations; names
  unique; the rule's sites give back their units (group_units);
- every site of the rule, alone and after every block is checkpointed, trains like eager over
  3 AdamW steps (loss, parameters, running statistics) on the tiny CNNs and a DenseNet-like
  model, with a simulated peak below the plain step's and a measured one within 5% of it;
- the units lower the peak of every block checkpointed alone (ResNet-50: the stem; U-Net++:
  the concatenations), on the tiny models, simulated;
- no site before some block is checkpointed; undone by uncheckpoint_blocks: the peak of the
  blocks alone again;
- a segment that draws random numbers (an embedding's dropout) is refused, naming the node;
  a step without repeated blocks has no segments and no site.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import peakcut
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.transform.checkpoint import (
    checkpoint_blocks,
    find_blocks,
    uncheckpoint_blocks,
    why_not_checkpoint,
)
from peakcut.transform.checkpoint_segments import blocks_with_inputs, forward_segments, group_units
from peakcut.transform.site import RewriteSite
from peakcut.workloads import get_workload
from tests.helpers import cross_entropy_loss, make_mlp, tiny_densenet
from tests.rules.test_offload_param import assert_close, eager_step
from tests.tolerance import tolerance

STEPS = 3
KIND = "checkpoint_segments"


def _sites(g: Graph, order: list[int] | tuple[int, ...]) -> list[RewriteSite]:
    return list(RULES.rewrite_candidates(g, order, kinds=[KIND]))


def _every_block(g: Graph, order):
    for blocks in find_blocks(g).values():
        rw, reasons = checkpoint_blocks(g, order, blocks)
        assert rw is not None and reasons == [None] * len(blocks), reasons
        g, order = rw.graph, rw.order
    return g, order


def _assert_measured_near(measured: int, simulated: int) -> None:
    """The spine's tolerance (5%): another CPU's kernels may take other scratch memory."""
    assert abs(simulated - measured) <= 0.05 * measured, (simulated, measured)


SEGMENTS = {"resnet50": ["conv1..maxpool", "ResNet..fc"], "unet": ["inc.0..UNet", "UNet..UNet", "UNet..UNet",
            "ups.0..UNet", "ups.1..UNet", "ups.2..UNet", "outc..outc"]}


@pytest.mark.parametrize("name", sorted(SEGMENTS))
def test_the_segments_between_the_blocks_of_the_tiny_cnns(name: str) -> None:
    inst = get_workload(name).build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    segments = forward_segments(g)
    assert [s.module.split(" (")[0] for s in segments] == SEGMENTS[name]
    joined = blocks_with_inputs(g)
    assert len({b.module for b in (*segments, *joined)}) == len(segments) + len(joined)
    in_blocks = {v for bs in find_blocks(g).values() for b in bs for v in b.nodes}
    assert {v for b in joined for v in b.nodes} == in_blocks | {v for s in segments[:-1] for v in s.nodes}
    for units in (segments, joined):
        flat = tuple(v for u in units for v in u.nodes)
        assert group_units(g, flat) == units


@pytest.mark.parametrize("name", ["densenet", "resnet50", "unet", "unetpp"])
def test_every_site_keeps_eager_numbers(name: str) -> None:
    """Each site of the rule, applied after every block is checkpointed: eager's loss,
    parameters and buffers over 3 AdamW steps; the measured peak near the simulated one."""
    if name == "densenet":
        model, batch, loss_fn = tiny_densenet()
    else:
        inst = get_workload(name).build("tiny")
        model, batch, loss_fn = inst.model, inst.batch, inst.loss_fn
    plain = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    g0, order0 = _every_block(plain, plain.order)
    sites = _sites(g0, order0)
    assert sites, "no site of checkpoint_segments"
    dtype = next(model.parameters()).dtype
    tol = tolerance(dtype, max(256, batch[0].numel()), STEPS)
    for site in sites:
        m, ref = copy.deepcopy(model), copy.deepcopy(model)
        opt, ref_opt = torch.optim.AdamW(m.parameters(), lr=1e-3), torch.optim.AdamW(ref.parameters(), lr=1e-3)
        rw = RULES.apply_rewrite(g0, order0, site)
        simulated = simulate(rw.graph, rw.order).peak_bytes
        assert simulated < simulate(plain, plain.order).peak_bytes, site.description
        step = peakcut.build(rw.graph, rw.order, optimizer=opt)
        if dtype == torch.float32:
            _assert_measured_near(peakcut.measure(step, m, batch, method="cpu-profiler", repeats=1).peak_bytes,
                                  simulated)
            m.load_state_dict(ref.state_dict())
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
            step = peakcut.build(rw.graph, rw.order, optimizer=opt)
        for k in range(STEPS):
            assert_close(step(m, batch), eager_step(ref, ref_opt, batch, loss_fn), f"{site.description}: loss {k}", tol)
        for (pname, p), q in zip(m.state_dict().items(), ref.state_dict().values(), strict=True):
            assert_close(p, q, f"{site.description}: {pname}", tol)


@pytest.mark.parametrize(("name", "site"), [("resnet50", "forward segment"), ("unetpp", "each with the ops")])
def test_a_unit_lowers_the_peak_of_every_block_checkpointed(name: str, site: str) -> None:
    """ResNet-50's stem and U-Net++'s concatenations, recomputed, lower the peak that
    checkpointing every block alone leaves (tiny size, simulated)."""
    inst = get_workload(name).build("tiny")
    plain = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    g, order = _every_block(plain, plain.order)
    blocks_only = simulate(g, order).peak_bytes
    found = [s for s in _sites(g, order) if site in s.description]
    assert found, [s.description for s in _sites(g, order)]
    rw = RULES.apply_rewrite(g, order, found[0])
    assert simulate(rw.graph, rw.order).peak_bytes < blocks_only


def test_offered_once_a_block_is_checkpointed_and_undone_by_uncheckpoint_blocks() -> None:
    """No site on the plain step (the blocks come first); the segments undone give the peak
    of the blocks checkpointed alone again."""
    inst = get_workload("resnet50").build("tiny")
    plain = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    assert _sites(plain, plain.order) == []
    g, order = _every_block(plain, plain.order)
    (site, *_) = [s for s in _sites(g, order) if "forward segment" in s.description]
    rw = RULES.apply_rewrite(g, order, site)
    modules = [u.module for u in group_units(g, site.nodes)]
    back, reasons = uncheckpoint_blocks(rw.graph, rw.order, modules)
    assert back is not None and reasons == [None] * len(modules), reasons
    assert simulate(back.graph, back.order).peak_bytes == simulate(g, order).peak_bytes


class _Embedded(nn.Module):
    """An embedding with dropout (the segment before the blocks), then repeated blocks."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 16)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16)) for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(torch.relu(self.embed(x)))
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def test_a_segment_that_draws_random_numbers_is_refused() -> None:
    torch.manual_seed(0)
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    g = peakcut.capture(_Embedded(0.1), batch, cross_entropy_loss, "adamw")
    first = forward_segments(g)[0]
    reason = why_not_checkpoint(g, g.order, first)
    assert reason is not None and "random" in reason and "drop" in reason
    g, order = _every_block(g, g.order)
    sites = _sites(g, order)
    assert sites and all(first.nodes[0] not in s.nodes for s in sites)


def test_no_repeated_blocks_no_segments() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, cross_entropy_loss, "adamw")
    assert not find_blocks(g) and forward_segments(g) == [] and blocks_with_inputs(g) == []
    assert _sites(g, g.order) == []
