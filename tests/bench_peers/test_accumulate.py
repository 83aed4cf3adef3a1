"""bench.peers.accumulate: the k-micro-batch step, captured and run for real, gives eager's update."""

from __future__ import annotations

import copy

import pytest
import torch

import peakcut
from bench.peers.accumulate import (
    BATCHNORM_WORKLOADS,
    accumulation_graph,
    accumulation_step,
    has_batchnorm,
    micro_batches,
    spec_of,
)
from peakcut.codegen import Step
from peakcut.runtime.equivalence import rounding_tolerance
from peakcut.workloads import WORKLOAD_NAMES, get_workload

STEPS = 2


def _close(ours: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    """Equal up to `tol` relative to the tensor's largest magnitude (gradients near zero included)."""
    scale = float(ref.abs().max()) or 1.0
    return bool(torch.allclose(ours, ref, rtol=tol, atol=tol * scale))


def test_accumulation_graph_gives_eagers_update() -> None:
    # GPT-Neo's loss is a mean over equally many tokens per micro-batch: accumulation is exact
    inst = get_workload("gpt-neo-1.3b").build("tiny")
    eager = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    g = accumulation_graph(inst.model, inst.batch, inst.loss_fn, 2, spec_of(eager))
    assert len(g.nodes) > len(eager.nodes)      # two forwards and backwards
    ours, ref, loop = (copy.deepcopy(inst.model) for _ in range(3))
    step = Step(g)
    opt = torch.optim.AdamW(ref.parameters(), foreach=False)
    loop_opt = torch.optim.AdamW(loop.parameters(), foreach=False)
    for _ in range(STEPS):
        loss = step(ours, inst.batch)
        ref_loss = inst.loss_fn(ref, inst.batch)
        ref_loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loop_loss = accumulation_step(loop, inst.batch, inst.loss_fn, loop_opt, 2)
    longest = max(p.numel() for p in ref.parameters())       # bounds every reduction's length
    tol = rounding_tolerance(torch.float32, longest, STEPS)
    assert _close(loss, ref_loss.detach(), tol) and _close(loop_loss, ref_loss.detach(), tol)
    for name, p in ref.named_parameters():
        for slot in ("exp_avg", "exp_avg_sq"):       # the gradients, through AdamW's moments
            assert _close(step.state[f"state:{name}.{slot}"], opt.state[p][slot], tol), (name, slot)
            assert _close(loop_opt.state[dict(loop.named_parameters())[name]][slot], opt.state[p][slot], tol)
    # the captured graph and the user's loop run the same ops: the same parameters
    for (name, a), b in zip(ours.named_parameters(), loop.parameters(), strict=True):
        assert _close(a.detach(), b.detach(), tol), name


def test_micro_batches_are_equal_slices() -> None:
    batch = (torch.arange(8).reshape(4, 2), torch.arange(4))
    parts = micro_batches(batch, 2)
    assert [p[1].tolist() for p in parts] == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="equal micro-batches"):
        micro_batches(batch, 3)


def test_batchnorm_models_are_named() -> None:
    with_bn = {name for name in WORKLOAD_NAMES if has_batchnorm(get_workload(name).build("tiny").model)}
    assert with_bn == set(BATCHNORM_WORKLOADS)
