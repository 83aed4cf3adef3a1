"""The update as the user's optimizer runs it: foreach and fused torch.optim implementations.

Each test runs the captured program next to the eager loop (`loss.backward(); clip;
optimizer.step()`) on a copy of the model, with the same optimizer (foreach=True or
fused=True, two param groups) on both, and compares loss, gradients, parameters and
`optimizer.state_dict()` after each of 3 steps. The program runs the list ops' per-tensor
kernels with the same scalars (or the list ops themselves), so the tolerance (tests.tolerance,
float32 over the model's width) is far looser than the differences seen.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import peakcut
from peakcut.ir.foreach import ForeachTag
from peakcut.ir.node import Phase
from peakcut.ir.serialize import graph_from_json, graph_to_json
from peakcut.ir.tags import FissionTag
from peakcut.ir.tensor import Role
from peakcut.transform.host_update import is_host_updated
from tests.capture.test_hooks import Net, data, loss_fn
from tests.rules.test_host_update import on_host
from tests.rules.test_offload_param import RULE as PARAM_RULE
from tests.rules.test_offload_param import STATE_RULE, offload
from tests.tolerance import tolerance

STEPS = 3
TOL = tolerance(torch.float32, 32, STEPS)
SEARCH = {"time_budget": 20, "max_states": 12, "device": "h200"}


# the small step of tests/capture/test_hooks.py: Net (linear, layer norm, linear), its loss and data


def two_groups(model: nn.Module) -> list[dict[str, Any]]:
    """Weight decay on matrices, none on biases and norms."""
    return [{"params": [p for p in model.parameters() if p.dim() > 1], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() <= 1], "weight_decay": 0.0}]


Make = Callable[[list[dict[str, Any]]], torch.optim.Optimizer]
OPTIMIZERS: dict[str, Make] = {
    "adamw-foreach": lambda g: torch.optim.AdamW(g, lr=1e-2, foreach=True),
    "adam-foreach-amsgrad-maximize": lambda g: torch.optim.Adam(g, lr=1e-2, amsgrad=True, maximize=True,
                                                                foreach=True),
    "sgd-momentum-foreach": lambda g: torch.optim.SGD(g, lr=0.1, momentum=0.9, dampening=0.1, foreach=True),
    "sgd-nesterov-foreach": lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.8, nesterov=True, foreach=True),
    "sgd-maximize-foreach": lambda g: torch.optim.SGD(g, lr=0.05, momentum=0.8, maximize=True, foreach=True),
    "adamw-fused": lambda g: torch.optim.AdamW(g, lr=1e-2, fused=True),
    "adam-fused-amsgrad": lambda g: torch.optim.Adam(g, lr=1e-2, amsgrad=True, fused=True),
}


def close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=TOL, atol=TOL, msg=lambda m: f"{what}: {m}")


def same_state(opt: torch.optim.Optimizer, ref: torch.optim.Optimizer) -> None:
    ours, theirs = opt.state_dict()["state"], ref.state_dict()["state"]
    assert ours.keys() == theirs.keys()
    for i, slots in theirs.items():
        assert ours[i].keys() == slots.keys(), i
        for k, v in slots.items():
            assert ours[i][k].device == v.device and ours[i][k].dtype == v.dtype, (i, k)
            close(ours[i][k], v, f"state {i}.{k}")


def eager_step(ref: nn.Module, ref_opt: torch.optim.Optimizer, batch: Any, clip: float) -> torch.Tensor:
    loss = loss_fn(ref, batch)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
    ref_opt.step()
    return loss.detach()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_list_update_matches_eager(name: str) -> None:
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](two_groups(model)), OPTIMIZERS[name](two_groups(ref))
    g = peakcut.capture(model, data(0), loss_fn, opt, max_grad_norm=0.5, keep_grads=True)
    runs = {t.op for n in g.nodes.values() if n.phase is Phase.OPTIMIZER and (t := n.tags.get(ForeachTag))}
    assert runs, "the update was not captured as list ops"
    step = peakcut.build(g, optimizer=opt)
    assert "torch._foreach_" in step.source or "torch._fused_adam" in step.source
    for k in range(STEPS):
        batch = data(k)
        loss = step(model, batch)
        ref_loss = eager_step(ref, ref_opt, batch, 0.5)
        close(loss, ref_loss, f"loss at step {k}")
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            close(p.grad, q.grad, f"{pname}.grad at step {k}")
            close(p, q, f"{pname} at step {k}")
            p.grad = None
            q.grad = None
    same_state(opt, ref_opt)


def test_fused_with_a_grad_scaler_is_refused() -> None:
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)
    with pytest.raises(ValueError, match="GradScaler with fused=True"):
        peakcut.capture(model, data(0), loss_fn, opt, grad_scaler=True)


def test_fused_sgd_is_refused() -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, fused=True)
    with pytest.raises(ValueError, match="fused=True is not supported"):
        peakcut.capture(model, data(0), loss_fn, opt)


def test_default_on_a_cpu_is_the_for_loop() -> None:
    """foreach=None on a CPU: torch.optim runs the single-tensor code, and so does the step."""
    model = Net()
    g = peakcut.capture(model, data(0), loss_fn, torch.optim.AdamW(model.parameters(), lr=1e-2))
    assert not any(n.tags.get(ForeachTag) for n in g.nodes.values())


# ------------------------------------------------------------------ rules on a list update
def train_like_eager(model: nn.Module, ref: nn.Module, opt: torch.optim.Optimizer, ref_opt: torch.optim.Optimizer,
                     step: Callable[..., torch.Tensor], clip: float | None = 0.5) -> None:
    for k in range(STEPS):
        batch = data(k)
        loss = step(batch)
        ref_loss = loss_fn(ref, batch)
        ref_loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        ref_opt.step()
        ref_opt.zero_grad()
        close(loss, ref_loss.detach(), f"loss at step {k}")
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            close(p, q, f"{pname} at step {k}")
    same_state(opt, ref_opt)


@pytest.mark.parametrize("name", ["adamw-foreach", "sgd-nesterov-foreach", "adamw-fused"])
@pytest.mark.parametrize("where", ["device", "host"])
def test_updates_on_the_host_and_offloads_keep_eager_numbers(name: str, where: str) -> None:
    """Every update the host-update rule takes runs on the host (the foreach runs it splits are
    written one call per tensor); with `host`, parameters and state kept in host memory first."""
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](two_groups(model)), OPTIMIZERS[name](two_groups(ref))
    g = peakcut.capture(model, data(0), loss_fn, opt, max_grad_norm=0.5)
    order = list(g.order)
    if where == "host":
        g, order = offload(g, order, PARAM_RULE, Role.PARAM)
        g, order = offload(g, order, STATE_RULE, Role.OPT_STATE)
    g, order = on_host(g, order)
    moved = [t for t in g.inputs if g.tensors[t].role is Role.PARAM and is_host_updated(g, t)]
    if "fused" in name:
        assert not moved          # the fused kernel is opaque to peakcut: its update stays
    else:
        assert moved
    step = peakcut.build(g, order, optimizer=opt)
    train_like_eager(model, ref, opt, ref_opt, lambda b: step(model, b))


@pytest.mark.parametrize("name", ["adamw-foreach", "sgd-momentum-foreach", "adamw-fused"])
def test_searched_plans_keep_eager_numbers(name: str) -> None:
    """A tight limit makes the search transform the step (fission, remat, swaps, the offloads,
    updates on the host); the best plan gives eager's numbers."""
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](two_groups(model)), OPTIMIZERS[name](two_groups(ref))
    try:
        plan = peakcut.optimize(model, data(0), loss_fn, opt, max_grad_norm=0.5, memory_limit=0.6, **SEARCH)
    except peakcut.LimitNotMet as e:
        plan = e.plan
    assert plan.graph is not None
    train_like_eager(model, ref, opt, ref_opt, plan.step)


def test_a_grad_scaler_with_a_foreach_update() -> None:
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(two_groups(model), lr=1e-2, foreach=True)
    ref_opt = torch.optim.AdamW(two_groups(ref), lr=1e-2, foreach=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
    plan = peakcut.optimize(model, data(0), loss_fn, opt, scaler=scaler, max_grad_norm=1.0, **SEARCH)
    for k in range(4):
        batch = data(k)
        if k == 1:
            batch[0][0, 0] = float("inf")
        loss = plan.step(batch)
        ref_loss = loss_fn(ref, batch)
        ref_scaler.scale(ref_loss).backward()
        ref_scaler.unscale_(ref_opt)
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        ref_opt.zero_grad()
        assert scaler.get_scale() == ref_scaler.get_scale(), k
        if k != 1:
            close(loss, ref_loss.detach(), f"loss at step {k}")
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            close(p, q, f"{pname} at step {k}")
    same_state(opt, ref_opt)


def test_list_op_tags_survive_the_graph_json() -> None:
    model = Net()
    opt = torch.optim.AdamW(two_groups(model), lr=1e-2, foreach=True)
    g = peakcut.capture(model, data(0), loss_fn, opt, max_grad_norm=0.5)
    back = graph_from_json(graph_to_json(g))
    assert {nid: n.tags.get(ForeachTag) for nid, n in back.nodes.items()} == \
        {nid: n.tags.get(ForeachTag) for nid, n in g.nodes.items()}
    assert peakcut.build(back, optimizer=opt).source == peakcut.build(g, optimizer=opt).source


class Wide(nn.Module):
    """Activations of a 512-row batch far above the weights: the search splits the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 256), nn.Linear(256, 256), nn.Linear(256, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def test_a_fissioned_plan_keeps_eager_numbers_and_its_list_calls() -> None:
    g = torch.Generator().manual_seed(0)
    batch = (torch.randn(512, 16, generator=g), torch.randint(0, 4, (512,), generator=g))
    torch.manual_seed(0)
    model = Wide()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS["adamw-foreach"](two_groups(model)), OPTIMIZERS["adamw-foreach"](two_groups(ref))
    try:
        plan = peakcut.optimize(model, batch, loss_fn, opt, max_grad_norm=0.5, memory_limit=0.5, time_budget=30,
                                max_states=20, device="h200")
    except peakcut.LimitNotMet as e:
        plan = e.plan
    assert any(n.tags.get(FissionTag) for n in plan.graph.nodes.values())
    assert "torch._foreach_" in plan.source
    tol = tolerance(torch.float32, 512, STEPS)

    def close_at(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")

    for k in range(STEPS):
        loss = plan.step(batch)
        ref_loss = loss_fn(ref, batch)
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
        ref_opt.zero_grad()
        close_at(loss, ref_loss.detach(), f"loss at step {k}")
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            close_at(p, q, f"{pname} at step {k}")
