"""The step binding keeps the optimizer state a plan holds in host memory there: in a host
buffer apart from device memory, made once, made again when the user's optimizer puts other
tensors in its place (optimizer.load_state_dict)."""

from __future__ import annotations

import copy

import torch
from torch import nn

import peakcut
from peakcut.codegen.update_inputs import UpdateInputs
from peakcut.spec.optimizers import OptimizerSpec

KEPT = "state:0.weight.exp_avg"


def _bound() -> tuple[nn.Module, torch.optim.Optimizer, UpdateInputs]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = peakcut.capture(model, torch.randn(2, 4), lambda m, x: m(x).sum(), opt)
    binding = UpdateInputs(OptimizerSpec.from_dict(g.signature.optimizer), False, frozenset({KEPT}))
    binding.attach(opt)
    return model, opt, binding


def test_state_kept_in_host_memory_is_placed_once() -> None:
    model, opt, binding = _bound()
    p = model[0].weight
    binding.prepare(model, False, set())
    kept = opt.state[p]["exp_avg"]
    other = opt.state[p]["exp_avg_sq"]
    assert kept.device.type == "cpu" and torch.equal(kept, torch.zeros_like(p))
    binding.discard(binding.prepare(model, False, set()))   # a second call: nothing moves
    assert opt.state[p]["exp_avg"] is kept and opt.state[p]["exp_avg_sq"] is other


def test_state_loaded_by_the_user_is_taken_back_to_host_memory() -> None:
    model, opt, binding = _bound()
    p = model[0].weight
    binding.prepare(model, False, set())
    opt.state[p]["exp_avg"].fill_(0.5)
    saved = copy.deepcopy(opt.state_dict())                  # as torch.save / torch.load give it
    opt.load_state_dict(saved)                               # other tensors, beside the parameter
    loaded = opt.state[p]["exp_avg"]
    binding.prepare(model, False, set())
    again = opt.state[p]["exp_avg"]
    assert again is not loaded and torch.equal(again, torch.full_like(p, 0.5))
