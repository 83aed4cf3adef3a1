"""An Accelerate loop through peakcut.integrations.accelerate against Accelerate's own loop.

Ten steps of a small MLP (AdamW with weight decay, a StepLR schedule, clipping at 1.0) from
the same weights: the losses, parameters, AdamW state and scheduler state agree within
tests.tolerance for the run's dtype (float32, or bfloat16 under Accelerate's bf16 autocast)
over the model's widest reduction (32) and the number of steps, the bound the loop tests use:
a plan may re-order or split reductions, which changes only the rounding. A checkpoint saved
with accelerator.save_state at step 5 and loaded into fresh objects continues to the same
numbers; gradient accumulation follows accelerator.accumulate; a step the accelerator's
GradScaler skips is skipped by the AcceleratedScheduler too; a multi-process accelerator is
refused.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

from tests.tolerance import tolerance

accelerate = pytest.importorskip("accelerate")
from accelerate.state import AcceleratorState, GradientState  # noqa: E402

import peakcut  # noqa: E402
from peakcut.integrations.accelerate import optimize  # noqa: E402

STEPS, WIDTH, CLIP = 10, 32, 1.0
SEARCH = {"device": "cpu", "time_budget": 5, "max_states": 8}
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "accelerate_loop.py"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, WIDTH)
        self.norm = nn.LayerNorm(WIDTH)
        self.fc2 = nn.Linear(WIDTH, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(torch.relu(self.fc1(x))))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def data(k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(k)
    return torch.randn(8, 8, generator=g), torch.randint(0, 4, (8,), generator=g)


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    """Accelerate keeps its state in process-wide singletons; each test starts from none."""
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def prepared(mixed_precision: str = "no", accumulation: int = 1, state: Path | None = None) -> tuple[Any, ...]:
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    acc = accelerate.Accelerator(cpu=True, mixed_precision=mixed_precision,
                                 gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    if state is not None:
        acc.load_state(str(state))
    return acc, model, opt, sched


def run(acc: Any, model: nn.Module, opt: Any, sched: Any, steps: range, plan: Any = None,
        save: tuple[int, Path] | None = None) -> list[float]:
    """Accelerate's loop (plan None) or the same loop through the plan; saves after step save[0]."""
    losses = []
    for k in steps:
        with acc.accumulate(model):
            if plan is not None:
                loss = plan.step(data(k))
            else:
                loss = loss_fn(model, data(k))
                acc.backward(loss)
                if acc.sync_gradients:
                    acc.clip_grad_norm_(model.parameters(), CLIP)
                opt.step()
                opt.zero_grad()
            sched.step()
        losses.append(loss.item())
        if save is not None and k + 1 == save[0]:
            acc.save_state(str(save[1]))
    return losses


def same(ours: tuple[Any, ...], ref: tuple[Any, ...], losses: list[float], ref_losses: list[float],
         dtype: torch.dtype) -> None:
    tol = tolerance(dtype, WIDTH, STEPS)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), rtol=tol, atol=tol)
    for (name, p), q in zip(ours[1].named_parameters(), ref[1].parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")
    state, ref_state = ours[2].state_dict(), ref[2].state_dict()
    assert state["param_groups"] == ref_state["param_groups"]
    for i, slots in ref_state["state"].items():
        for slot, value in slots.items():
            torch.testing.assert_close(state["state"][i][slot], value, rtol=tol, atol=tol,
                                       msg=lambda m, i=i, s=slot: f"state {i}.{s}: {m}")
    assert ours[3].state_dict() == ref[3].state_dict()


@pytest.mark.parametrize("mixed_precision", ["no", "bf16"])
def test_ten_steps_match_accelerate(mixed_precision: str) -> None:
    ref = prepared(mixed_precision)
    ref_losses = run(*ref, range(STEPS))
    ours = prepared(mixed_precision)
    plan = optimize(ours[0], ours[1], data(0), loss_fn, ours[2], max_grad_norm=CLIP, **SEARCH)
    losses = run(*ours, range(STEPS), plan)
    same(ours, ref, losses, ref_losses, torch.float32 if mixed_precision == "no" else torch.bfloat16)


def test_save_state_and_resume(tmp_path: Path) -> None:
    ref = prepared()
    ref_losses = run(*ref, range(STEPS))
    first = prepared()
    plan = optimize(first[0], first[1], data(0), loss_fn, first[2], max_grad_norm=CLIP, **SEARCH)
    losses = run(*first, range(5), plan, save=(5, tmp_path / "state"))
    resumed = prepared(state=tmp_path / "state")
    plan = optimize(resumed[0], resumed[1], data(5), loss_fn, resumed[2], max_grad_norm=CLIP, **SEARCH)
    losses += run(*resumed, range(5, STEPS), plan)
    same(resumed, ref, losses, ref_losses, torch.float32)


def test_gradient_accumulation_follows_accelerate() -> None:
    ref = prepared(accumulation=2)
    ref_losses = run(*ref, range(STEPS))
    ours = prepared(accumulation=2)
    plan = optimize(ours[0], ours[1], data(0), loss_fn, ours[2], max_grad_norm=CLIP, **SEARCH)
    losses = run(*ours, range(STEPS), plan)
    same(ours, ref, losses, ref_losses, torch.float32)
    with ours[0].accumulate(ours[1]):     # an 11th micro-batch
        ours[0].sync_gradients = True     # as at the end of a dataloader
        with pytest.raises(ValueError, match="accelerator.accumulate"):
            plan.step(data(0))


def test_a_step_the_scaler_skips_is_skipped_by_the_scheduler_too() -> None:
    """fp16 (a GPU's mixed precision in Accelerate) in a plan: the accelerator's GradScaler (a CPU one
    here) skips the update on an inf gradient, and AcceleratedScheduler sees step_was_skipped."""
    acc, model, opt, sched = prepared()
    acc.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1)     # grows after each update
    ref_model = Net()
    ref_model.load_state_dict(model.state_dict())
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2, weight_decay=0.1)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=1)
    plan = optimize(acc, model, data(0), loss_fn, opt, max_grad_norm=CLIP, **SEARCH)
    for k in range(3):
        batch = data(k)
        if k == 1:
            batch[0][0, 0] = float("inf")
        plan.step(batch)
        assert opt.step_was_skipped == (k == 1)
        sched.step()
        ref_scaler.scale(loss_fn(ref_model, batch)).backward()
        ref_scaler.unscale_(ref_opt)
        torch.nn.utils.clip_grad_norm_(ref_model.parameters(), CLIP)
        ref_scaler.step(ref_opt)
        ref_scaler.update()
        ref_opt.zero_grad()
    assert sched.scheduler.last_epoch == 2
    assert acc.scaler.state_dict() == ref_scaler.state_dict()
    tol = tolerance(torch.float32, WIDTH, 3)
    for p, q in zip(model.parameters(), ref_model.parameters(), strict=True):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=tol, atol=tol)


def test_multi_process_and_scaler_arguments_are_refused() -> None:
    acc, model, opt, _ = prepared()
    with mock.patch.object(type(acc), "num_processes", new_callable=mock.PropertyMock, return_value=2), \
            pytest.raises(ValueError, match="multi-process"):
        optimize(acc, model, data(0), loss_fn, opt, **SEARCH)
    with pytest.raises(TypeError, match="comes from the accelerator"):
        optimize(acc, model, data(0), loss_fn, opt, accumulate=2, **SEARCH)
    with pytest.raises(TypeError, match="accelerate.Accelerator"):
        optimize(object(), model, data(0), loss_fn, opt, **SEARCH)


def test_peakcut_optimize_points_to_the_helper() -> None:
    acc, model, opt, _ = prepared()
    with pytest.raises(TypeError, match=r"peakcut\.integrations\.accelerate\.optimize"):
        peakcut.optimize(model, data(0), loss_fn, opt, **SEARCH)


def test_missing_accelerate_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "accelerate", None)
    with pytest.raises(ImportError, match=r"peakcut\[accelerate\]"):
        optimize(object(), Net(), data(0), loss_fn, None)


def test_example_runs() -> None:
    result = runpy.run_path(str(EXAMPLE), run_name="example")["main"](["--steps", "4"])
    tol = tolerance(torch.bfloat16, WIDTH, 4)
    torch.testing.assert_close(torch.tensor(result["losses"]), torch.tensor(result["accelerate_losses"]),
                               rtol=tol, atol=tol)
