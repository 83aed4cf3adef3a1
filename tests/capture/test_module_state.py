"""Tensors a forward stores on its module (a mask made on the first call, a buffer registered
on the fly) are FakeTensors under capture: capture puts the module back as it was, and the
captured step makes them in its graph at every step, with eager's numbers."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import torch
from torch import nn

import peakcut
from tests.tolerance import tolerance


class LazyMask(nn.Module):
    """Keeps a causal mask as a plain attribute, made when the sequence length changes."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.mask: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mask is None or self.mask.shape[0] != x.shape[1]:
            self.mask = torch.ones(x.shape[1], x.shape[1]).tril() / x.shape[1]
        return self.fc(self.mask @ x)


class LazyBuffer(nn.Module):
    """Registers a position buffer on its first call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "pos"):
            self.register_buffer("pos", torch.arange(x.shape[1], dtype=x.dtype).view(1, -1, 1), persistent=False)
        return self.fc(x + self.pos)


class Both(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = LazyMask(), LazyBuffer()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def loss_fn(m: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
    return m(batch[0]).pow(2).mean()


def test_capture_leaves_no_fake_tensor_on_the_module() -> None:
    torch.manual_seed(0)
    model = Both()
    peakcut.capture(model, (torch.randn(2, 3, 4),), loss_fn, "adamw")
    assert model.a.mask is None
    assert not hasattr(model.b, "pos")
    model(torch.randn(2, 3, 4))           # the user's own eager call still works


def test_tensors_made_on_the_fly_step_as_eager() -> None:
    torch.manual_seed(0)
    model = Both()
    ref = copy.deepcopy(model)
    ref(torch.randn(2, 3, 4))             # eager keeps its mask and buffer from a first call
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, (torch.randn(2, 3, 4),), loss_fn, opt, time_budget=10, max_states=8,
                            device="h200")
    for _k, tol in steps_beside_eager(plan.step, ref, ref_opt):
        for p, q in zip(model.parameters(), ref.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=tol, atol=tol)


def steps_beside_eager(step: Callable[[tuple[torch.Tensor]], torch.Tensor], ref: nn.Module,
                       ref_opt: torch.optim.Optimizer) -> Iterator[tuple[int, float]]:
    """Three steps of `step` and of the eager loop on `ref`, the same batches; checks the
    losses and yields (step number, tolerance) after each for the caller's own checks."""
    for k in range(1, 4):
        batch = (torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(k)),)
        loss = step(batch)
        ref_loss = loss_fn(ref, batch)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        tol = tolerance(torch.float32, 12, k)
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=tol, atol=tol)
        yield k, tol


class Rebinds(nn.Module):
    """Assigns new tensors to registered buffers in forward: an EMA and a step counter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("ema", torch.zeros(4))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.ema = 0.9 * self.ema + 0.1 * y.detach().mean((0, 1))
        self.calls = self.calls + 1
        return y - self.ema * (self.calls % 2)


class Cached(nn.Module):
    """Keeps a tensor in a dict attribute, made on the first call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.cache: dict[int, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] not in self.cache:
            self.cache[x.shape[1]] = torch.ones(x.shape[1], 1) * 0.5
        return self.fc(x * self.cache[x.shape[1]])


def test_a_dict_cache_is_left_as_it_was() -> None:
    model = Cached()
    peakcut.capture(model, (torch.randn(2, 3, 4),), loss_fn, "adamw")
    assert model.cache == {}
    model(torch.randn(2, 3, 4))


def test_buffers_the_forward_assigns_keep_their_new_values_as_in_eager() -> None:
    torch.manual_seed(0)
    model = Rebinds()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    step = peakcut.build(peakcut.capture(model, (torch.randn(2, 3, 4),), loss_fn, opt), optimizer=opt)
    for k, tol in steps_beside_eager(lambda batch: step(model, batch), ref, ref_opt):
        torch.testing.assert_close(model.ema, ref.ema, rtol=tol, atol=tol)
        assert int(model.calls) == int(ref.calls) == k
