"""The user's torch.optim optimizer drives the step: groups, schedules, state, checkpoints.

Each test runs the captured program next to the eager loop (`loss.backward(); clip;
optimizer.step(); optimizer.zero_grad()`) on a copy of the model and compares loss,
parameters and `optimizer.state_dict()`. The program calls the same kernels with the
same arguments as the code torch.optim runs (single-tensor; foreach, tests/loop/test_foreach_update.py), so the tolerance (tests.tolerance,
float32, reductions of the model's width) is far looser than the differences seen.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.update_inputs import StepBindingError
from tests.helpers import cross_entropy_loss, make_mlp
from tests.tolerance import tolerance

STEPS = 4


loss_fn = cross_entropy_loss
make = make_mlp


def two_groups(model: nn.Module) -> list[dict[str, Any]]:
    """The transformer recipe: weight decay on matrices, none on biases and norms."""
    decay = [p for p in model.parameters() if p.dim() > 1]
    rest = [p for p in model.parameters() if p.dim() <= 1]
    return [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]


TOL = tolerance(torch.float32, 16, STEPS)


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=TOL, atol=TOL, msg=lambda m: f"{what}: {m}")


def assert_same_state(opt: torch.optim.Optimizer, ref: torch.optim.Optimizer) -> None:
    ours, theirs = opt.state_dict(), ref.state_dict()
    assert ours["state"].keys() == theirs["state"].keys()
    for i, slots in theirs["state"].items():
        assert ours["state"][i].keys() == slots.keys(), i
        for k, v in slots.items():
            if isinstance(v, torch.Tensor):
                assert_close(ours["state"][i][k], v, f"state {i}.{k}")
    assert [{k: v for k, v in g.items() if k != "params"} for g in ours["param_groups"]] == \
        [{k: v for k, v in g.items() if k != "params"} for g in theirs["param_groups"]]


def run_both(make_opt: Callable[[nn.Module], torch.optim.Optimizer], steps: int = STEPS,
             max_grad_norm: float | None = None, between: Callable[[int, torch.optim.Optimizer], None] | None = None,
             ) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer]:
    model, batch = make()
    ref = copy.deepcopy(model)
    opt, ref_opt = make_opt(model), make_opt(ref)
    step = peakcut.build(peakcut.capture(model, batch, loss_fn, opt, max_grad_norm=max_grad_norm), optimizer=opt)
    for k in range(steps):
        loss = step(model, batch)
        ref_loss = loss_fn(ref, batch)
        ref_loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), max_grad_norm)
        ref_opt.step()
        ref_opt.zero_grad()
        assert_close(loss, ref_loss.detach(), f"loss at step {k}")
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert_close(p, q, f"{name} at step {k}")
            assert p.grad is None
        if between is not None:
            between(k, opt)
            between(k, ref_opt)
    assert_same_state(opt, ref_opt)
    return opt, ref_opt


OPTIMIZERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
    "sgd-momentum-dampening-wd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, dampening=0.2,
                                                           weight_decay=1e-2),
    "sgd-nesterov-maximize": lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.8, nesterov=True,
                                                       maximize=True),
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
    "adam-wd-amsgrad": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, weight_decay=1e-2, amsgrad=True),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.8, 0.95), eps=1e-6),
    "adamw-amsgrad-maximize": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, amsgrad=True, maximize=True),
    "adamw-foreach": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_each_optimizer_matches_eager(name: str) -> None:
    run_both(OPTIMIZERS[name])


def test_two_groups_schedule_and_clipping() -> None:
    def make_opt(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(two_groups(m), lr=3e-2)

    scheds: dict[int, torch.optim.lr_scheduler.LRScheduler] = {}

    def between(k: int, opt: torch.optim.Optimizer) -> None:
        if id(opt) not in scheds:
            scheds[id(opt)] = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 2) * 0.9 ** s)
        scheds[id(opt)].step()

    opt, ref = run_both(make_opt, steps=5, max_grad_norm=0.05, between=between)
    assert opt.param_groups[0]["lr"] == ref.param_groups[0]["lr"] != 3e-2


def test_hand_edit_of_param_groups_takes_effect() -> None:
    def between(k: int, opt: torch.optim.Optimizer) -> None:
        opt.param_groups[0]["lr"] *= 0.5
        opt.param_groups[0]["momentum"] = 0.5

    run_both(lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), between=between)


def test_structural_change_is_refused() -> None:
    model, batch = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    step = peakcut.build(peakcut.capture(model, batch, loss_fn, opt), optimizer=opt)
    step(model, batch)
    opt.param_groups[0]["weight_decay"] = 0.1
    with pytest.raises(StepBindingError, match="weight_decay"):
        step(model, batch)


def test_optimizer_over_a_subset_updates_only_its_parameters() -> None:
    def make_opt(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(m.fc2.parameters(), lr=1e-2)

    model, batch = make()
    ref = copy.deepcopy(model)
    opt, ref_opt = make_opt(model), make_opt(ref)
    before = copy.deepcopy(model.fc1.state_dict())
    step = peakcut.build(peakcut.capture(model, batch, loss_fn, opt), optimizer=opt)
    for _ in range(3):
        step(model, batch)
        loss_fn(ref, batch).backward()
        ref_opt.step()
        ref_opt.zero_grad()          # clears fc2's grads only: fc1's accumulate, as here
    for name, value in before.items():
        assert torch.equal(model.fc1.state_dict()[name], value), name
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_close(p, q, name)
        assert (p.grad is None) == (q.grad is None), name
        if q.grad is not None:
            assert_close(p.grad, q.grad, f"{name}.grad")
    assert_same_state(opt, ref_opt)


@pytest.mark.parametrize("direction", ["eager-then-plan", "plan-then-eager"])
def test_checkpoint_resumes_across_eager_and_plan(direction: str, tmp_path: Any) -> None:
    def make_opt(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(two_groups(m), lr=1e-2)

    model, batch = make()
    ref = copy.deepcopy(model)
    ref_opt = make_opt(ref)
    for _ in range(6):                     # the uninterrupted eager run
        loss_fn(ref, batch).backward()
        ref_opt.step()
        ref_opt.zero_grad()

    first = copy.deepcopy(model)
    opt = make_opt(first)
    if direction == "eager-then-plan":
        for _ in range(3):
            loss_fn(first, batch).backward()
            opt.step()
            opt.zero_grad()
    else:
        step = peakcut.build(peakcut.capture(first, batch, loss_fn, opt), optimizer=opt)
        for _ in range(3):
            step(first, batch)
    torch.save({"model": first.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")

    second, _ = make()
    opt2 = make_opt(second)
    ckpt = torch.load(tmp_path / "ckpt.pt")
    second.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    if direction == "eager-then-plan":
        step = peakcut.build(peakcut.capture(second, batch, loss_fn, opt2), optimizer=opt2)
        for _ in range(3):
            step(second, batch)
    else:
        for _ in range(3):
            loss_fn(second, batch).backward()
            opt2.step()
            opt2.zero_grad()
    for (name, p), q in zip(second.named_parameters(), ref.parameters(), strict=True):
        assert_close(p, q, name)
    assert_same_state(opt2, ref_opt)


def test_unsupported_optimizer_is_named() -> None:
    model, batch = make()
    with pytest.raises(TypeError, match=r"RMSprop is not supported.*SGD, torch.optim.Adam, torch.optim.AdamW"):
        peakcut.capture(model, batch, loss_fn, torch.optim.RMSprop(model.parameters()))
    with pytest.raises(ValueError, match="capturable=True is not supported"):
        peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters(), capturable=True))


def test_grads_accumulate_without_optimizer() -> None:
    """optimizer=None: plan.step adds into p.grad like loss.backward(), so accumulation works."""
    model, batch = make()
    ref = copy.deepcopy(model)
    step = peakcut.build(peakcut.capture(model, batch, loss_fn, None))
    halves = [(batch[0][:3], batch[1][:3]), (batch[0][3:], batch[1][3:])]
    step_half = peakcut.build(peakcut.capture(model, halves[0], loss_fn, None))
    for b in halves:
        step_half(model, b)
        loss_fn(ref, b).backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_close(p.grad, q.grad, name)
    del step


def test_scheduler_sees_an_optimizer_step() -> None:
    """No 'lr_scheduler.step() before optimizer.step()' warning: the plan marks the step as done."""
    import warnings

    model, batch = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    step = peakcut.build(peakcut.capture(model, batch, loss_fn, opt), optimizer=opt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(model, batch)
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.05
