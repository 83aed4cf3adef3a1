"""capture_with_gradients: the caller's loss-and-gradients function plus peakcut's update."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch.func import functional_call

import peakcut
from peakcut.capture import capture_with_gradients, describe_optimizer
from peakcut.ir import Phase
from peakcut.ir.check import check_graph
from peakcut.memory import simulate


def _mlp() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    return model, (torch.randn(5, 4), torch.randint(0, 3, (5,)))


def _autograd_gradients(model: torch.nn.Module) -> Callable[..., Any]:
    """Loss and gradients by torch.autograd, as peakcut.capture would compute them."""
    names = [n for n, _ in model.named_parameters()]

    def gradients(params: list[torch.Tensor], buffers: list[torch.Tensor],
                  leaves: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        x, y = leaves
        live = [p.detach().requires_grad_() for p in params]
        loss = torch.nn.functional.cross_entropy(functional_call(model, dict(zip(names, live, strict=True)), (x,)), y)
        return loss.detach(), list(torch.autograd.grad(loss, live))

    return gradients


def test_inputs_outputs_and_phases() -> None:
    model, batch = _mlp()
    g = capture_with_gradients(model, batch, _autograd_gradients(model), describe_optimizer(model, "adamw"))
    check_graph(g)
    params = [f"param:{n}" for n, _ in model.named_parameters()]
    states = [f"state:{n[6:]}.{s}" for n in params for s in ("exp_avg", "exp_avg_sq")]
    assert g.input_names[:len(params)] == params
    assert sorted(g.input_names[len(params):-2]) == sorted(states)
    assert g.input_names[-2:] == ["batch:0", "batch:1"]
    assert len(g.outputs) == 1
    phases = {n.phase for n in g.nodes.values()}
    assert phases == {Phase.FORWARD, Phase.OPTIMIZER}


def test_step_matches_eager_sgd() -> None:
    model, batch = _mlp()
    eager = copy.deepcopy(model)
    spec = describe_optimizer(model, "sgd")
    g = capture_with_gradients(model, batch, _autograd_gradients(model), spec)
    step = peakcut.build(g)
    opt = torch.optim.SGD(eager.parameters(), lr=spec.groups[0].hyper["lr"], momentum=0.9)
    for _ in range(2):
        loss = step(model, batch)
        opt.zero_grad()
        expected = torch.nn.functional.cross_entropy(eager(batch[0]), batch[1])
        expected.backward()
        opt.step()
        assert torch.equal(loss.detach(), expected.detach())
    for p, q in zip(model.parameters(), eager.parameters(), strict=True):
        assert torch.equal(p, q)


def test_meta_model_allocates_nothing() -> None:
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 8))
    batch = (torch.empty(64, 1024, device="meta"), torch.empty(64, dtype=torch.long, device="meta"))
    g = capture_with_gradients(model, batch, _autograd_gradients(model), describe_optimizer(model, "sgd"))
    assert simulate(g).peak_bytes > 2 * 1024 * 1024 * 4   # weights, gradients, momentum: simulated
