"""Edges of the training loop a review found: each was silently wrong or left state behind."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.update_inputs import StepBindingError
from peakcut.ir.ops import GATE_OP
from tests.helpers import MLP, cross_entropy_loss, make_mlp
from tests.tolerance import tolerance

TOL = tolerance(torch.float32, 16, 4)
loss_fn = cross_entropy_loss
make = make_mlp


def params_close(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=TOL, atol=TOL, msg=lambda m, name=name: f"{name}: {m}")


def test_a_requires_grad_change_after_planning_is_refused() -> None:
    model, batch = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = peakcut.build(peakcut.capture(model, batch, loss_fn, opt), optimizer=opt)
    step(model, batch)
    before = copy.deepcopy(model.state_dict())
    for p in model.fc1.parameters():
        p.requires_grad_(False)
    with pytest.raises(StepBindingError, match="no longer requires a gradient"):
        step(model, batch)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_adam_with_decoupled_weight_decay_in_one_group_only() -> None:
    def make_opt(m: nn.Module) -> torch.optim.Optimizer:
        mats = [p for p in m.parameters() if p.dim() > 1]
        rest = [p for p in m.parameters() if p.dim() <= 1]
        return torch.optim.Adam([{"params": mats}, {"params": rest, "decoupled_weight_decay": True}],
                                lr=1e-2, weight_decay=0.5, foreach=False)

    model, batch = make()
    ref = copy.deepcopy(model)
    opt, ref_opt = make_opt(model), make_opt(ref)
    step = peakcut.build(peakcut.capture(model, batch, loss_fn, opt), optimizer=opt)
    for _ in range(3):
        step(model, batch)
        loss_fn(ref, batch).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    params_close(model, ref)


def test_a_tiny_constant_in_the_model_captures() -> None:
    class Normalize(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x / x.norm(dim=-1, keepdim=True).clamp(min=1e-100)

    x = torch.randn(3, 5, dtype=torch.float64)
    step = peakcut.build(peakcut.capture(Normalize(), (x,), None, None))
    torch.testing.assert_close(step(Normalize(), (x,)), Normalize()(x))


def test_a_failing_call_leaves_no_optimizer_state() -> None:
    """SGD with dampening: a zero buffer left by a failed call would change the next update."""
    def make_opt(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.5, foreach=False)

    model, batch = make()
    ref = copy.deepcopy(model)
    opt, ref_opt = make_opt(model), make_opt(ref)
    step = peakcut.build(peakcut.capture(model, batch, loss_fn, opt), optimizer=opt)
    bad = (batch[0], torch.full_like(batch[1], 7))          # label out of range: the loss raises
    with pytest.raises((IndexError, RuntimeError)):
        step(model, bad)
    with pytest.raises(StepBindingError):
        step(model, (batch[0][:2], batch[1][:2]))             # another shape: refused before any state
    assert len(opt.state) == 0
    measured = peakcut.measure(step, model, batch, method="cpu-profiler", repeats=1)
    assert measured.peak_bytes > 0 and len(opt.state) == 0
    for _ in range(2):
        step(model, batch)
        loss_fn(ref, batch).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    params_close(model, ref)


def test_the_grad_scaler_gate_follows_every_output_and_buffer_write() -> None:
    class WithNorm(MLP):
        def __init__(self) -> None:
            super().__init__()
            self.bn = nn.BatchNorm1d(8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(self.bn(x))

    torch.manual_seed(0)
    model = WithNorm()
    batch = (torch.randn(6, 8), torch.randint(0, 4, (6,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = peakcut.capture(model, batch, loss_fn, opt, grad_scaler=True, keep_grads=True)
    (gate,) = [n.id for n in g.nodes.values() if n.op == GATE_OP]
    before = set(g.control.get(gate, ()))
    assert {g.producer(t) for t in g.outputs} <= before       # loss, kept gradients, found_inf
    buffers = {g.tensors[t].storage for t, n in zip(g.inputs, g.input_names, strict=True) if n.startswith("buffer:")}
    writers = [n.id for n in g.nodes.values() if {g.tensors[t].storage for t in n.mutated_ids()} & buffers]
    assert writers and all(w in before for w in writers)


def test_a_loaded_plan_exposes_its_optimizer_and_an_accumulating_plan_refuses_to_save(tmp_path: Any) -> None:
    model, batch = make()
    plan = peakcut.optimize(model, batch, loss_fn, "adamw", time_budget=10, max_states=4)
    saved = plan.save(tmp_path / "plan")
    loaded = peakcut.load_plan(saved, copy.deepcopy(model))
    loaded.step(batch)
    assert isinstance(loaded.optimizer, torch.optim.AdamW) and len(loaded.optimizer.state) > 0
    acc = peakcut.optimize(model, batch, loss_fn, torch.optim.SGD(model.parameters(), lr=0.1), accumulate=2,
                           time_budget=10, max_states=4)
    with pytest.raises(NotImplementedError, match="accumulate"):
        acc.save(tmp_path / "acc")
