"""plan.step in the user's loop: GradScaler, accumulation, a short last batch, dropout.

Plans come from peakcut.optimize with a bounded search (max_states), so the program may be
re-ordered or transformed; the eager reference runs the same loop on a copy of the model.
Tolerance: tests.tolerance for float32 over the model's widths and the number of steps.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.update_inputs import StepBindingError
from tests.tolerance import tolerance

SEARCH = {"time_budget": 20, "max_states": 12, "device": "h200"}


class Net(nn.Module):
    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.drop = nn.Dropout(p)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.drop(torch.relu(self.fc1(x)))))


def loss_fn(model: Any, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)


def close(a: torch.Tensor, b: torch.Tensor, steps: int, what: str) -> None:
    tol = tolerance(torch.float32, 32, steps)
    torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


def params_close(model: nn.Module, ref: nn.Module, steps: int) -> None:
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        close(p, q, steps, name)


def test_grad_scaler_skips_the_step_with_an_inf_gradient() -> None:
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
    plan = peakcut.optimize(model, data(8, 0), loss_fn, opt, scaler=scaler, max_grad_norm=1.0, **SEARCH)
    for k in range(5):
        batch = data(8, k)
        if k in (0, 3):               # the first step too: no state may be left behind
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
        assert len(opt.state) == len(ref_opt.state), k
        if k not in (0, 3):
            close(loss, ref_loss.detach(), k + 1, "loss")
        params_close(model, ref, k + 1)
    assert scaler.state_dict() == ref_scaler.state_dict()
    steps = [float(s["step"]) for s in opt.state.values()]
    assert steps == [3.0] * len(steps)


def test_accumulate_matches_eager_accumulation() -> None:
    k = 3
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, foreach=False)
    plan = peakcut.optimize(model, data(4, 0), loss_fn, opt, accumulate=k, max_grad_norm=0.5, **SEARCH)
    for i in range(2 * k):
        batch = data(4, i)
        loss = plan.step(batch)
        ref_loss = loss_fn(ref, batch)
        ref_loss.backward()
        if (i + 1) % k == 0:
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
            ref_opt.step()
            ref_opt.zero_grad()
        close(loss, ref_loss.detach(), i + 1, "loss")
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), (i, name)
            if q.grad is not None:
                close(p.grad, q.grad, i + 1, f"{name}.grad")
        params_close(model, ref, i + 1)
    assert plan.micro_steps == 0


def test_short_last_batch_is_planned_again_or_refused() -> None:
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    plan = peakcut.optimize(model, data(8, 0), loss_fn, opt, **SEARCH)
    short = data(3, 1)
    for batch in (data(8, 0), short, data(8, 2), short):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan.step(batch)
        loss_fn(ref, batch).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        if batch is short and not getattr(test_short_last_batch_is_planned_again_or_refused, "_seen", False):
            assert any("planned again" in str(w.message) for w in caught)
            test_short_last_batch_is_planned_again_or_refused._seen = True  # type: ignore[attr-defined]
        else:
            assert not any("planned again" in str(w.message) for w in caught)
    params_close(model, ref, 4)

    strict = peakcut.optimize(model, data(8, 0), loss_fn, opt, replan=False, **SEARCH)
    with pytest.raises(StepBindingError, match="another shape"):
        strict.step(short)


def test_dropout_gives_eager_numbers_under_the_same_seed() -> None:
    torch.manual_seed(0)
    model = Net(p=0.3)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=False)
    try:      # a tight limit makes the search transform the step; the best plan is what we run
        plan = peakcut.optimize(model, data(8, 0), loss_fn, opt, memory_limit=0.8, **SEARCH)
    except peakcut.LimitNotMet as e:
        plan = e.plan
    assert any("dropout" in n.op or "bernoulli" in n.op for n in plan.graph.nodes.values())
    for k in range(3):
        batch = data(8, k)
        torch.manual_seed(100 + k)
        loss = plan.step(batch)
        torch.manual_seed(100 + k)
        ref_loss = loss_fn(ref, batch)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        close(loss, ref_loss.detach(), k + 1, "loss")
        params_close(model, ref, k + 1)


def test_no_parameter_updates_before_the_clipping_norm_exists() -> None:
    """With max_grad_norm every write of a parameter or of optimizer state follows the total norm,
    in whatever order the search chose (it reads the clipped gradients)."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    try:
        plan = peakcut.optimize(model, data(8, 0), loss_fn, opt, max_grad_norm=1.0, memory_limit=0.7, **SEARCH)
    except peakcut.LimitNotMet as e:
        plan = e.plan
    g, order = plan.graph, plan.order
    norms = [i for i, nid in enumerate(order) if g.nodes[nid].op == "aten.linalg_vector_norm.default"]
    total = max(norms)           # the norm of the stacked per-gradient norms comes last
    owned = {g.tensors[t].storage for t, name in zip(g.inputs, g.input_names, strict=True)
             if name.startswith(("param:", "state:"))}
    writes = [i for i, nid in enumerate(order)
              if any(g.tensors[t].storage in owned for t in g.nodes[nid].mutated_ids())]
    assert writes and min(writes) > total


def test_accumulate_with_a_grad_scaler() -> None:
    """Scaled gradients add up over the micro-batches and are unscaled once, before the update."""
    k = 2
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=1)
    plan = peakcut.optimize(model, data(4, 0), loss_fn, opt, accumulate=k, scaler=scaler, **SEARCH)
    for i in range(3 * k):
        batch = data(4, i)
        if i == 3:                       # inf in the second micro-batch of the second update
            batch[0][1, 2] = float("inf")
        plan.step(batch)
        ref_scaler.scale(loss_fn(ref, batch)).backward()
        if (i + 1) % k == 0:
            ref_scaler.step(ref_opt)
            ref_scaler.update()
            ref_opt.zero_grad()
        assert scaler.get_scale() == ref_scaler.get_scale(), i
        params_close(model, ref, i + 1)
    assert len(opt.state) == len(ref_opt.state)
    assert [float(s["step"]) for s in opt.state.values()] == [float(s["step"]) for s in ref_opt.state.values()]


def test_a_programs_first_run_gives_back_what_it_freed(monkeypatch) -> None:
    """The first run of each program a plan builds (its source, its arena, the optimizer's
    state made between its transient tensors) gives back what it freed (malloc_trim); later
    steps do not trim (a heap that keeps freed memory keeps the steps' own blocks)."""
    from peakcut.optimizer import plan as plan_module

    trims: list[int] = []
    monkeypatch.setattr(plan_module, "release_freed_host_memory", lambda: trims.append(1) or True)
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, data(8, 0), loss_fn, opt, **SEARCH)
    for seed, expected in ((0, 1), (1, 1), (2, 1)):
        plan.step(data(8, seed))
        assert len(trims) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan.step(data(3, 3))               # a new shape: planned and built again
    assert len(trims) == 2
