"""Random numbers the step draws: what capture refuses, by name, before anything runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peakcut


class Noisy(nn.Module):
    def __init__(self, generator: torch.Generator | None = None, reseed: bool = False,
                 set_state: bool = False) -> None:
        super().__init__()
        self.fc, self.generator, self.reseed = nn.Linear(4, 4), generator, reseed
        self.state = torch.default_generator.get_state() if set_state else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reseed:
            torch.manual_seed(3)
        if self.state is not None:          # a generator's own set_state: not traced
            torch.default_generator.set_state(self.state)
            x = nn.functional.dropout(x, 0.5)
        if self.generator is not None:
            x = x + torch.randn(x.shape, generator=self.generator)
        return self.fc(x)


def loss_fn(m: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
    return m(batch[0]).pow(2).mean()


@pytest.mark.parametrize("model, words", [
    (Noisy(generator=torch.Generator().manual_seed(1)), ["aten.randn.generator", "torch.Generator"]),
    (Noisy(reseed=True), ["torch.manual_seed"]),
    (Noisy(set_state=True), ["random generator", "once, at capture"]),
], ids=["own generator", "manual_seed", "generator's set_state"])
def test_draws_the_step_cannot_repeat_are_refused_by_name(model: nn.Module, words: list[str]) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(peakcut.CaptureError) as e:
        peakcut.optimize(model, (torch.randn(2, 4),), loss_fn, opt, time_budget=5, max_states=2, device="h200")
    assert all(w in str(e.value) for w in words), str(e.value)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert not opt.state


def test_capture_leaves_the_generator_as_it_was() -> None:
    model, x = Noisy(set_state=True), torch.randn(2, 4)
    before = torch.get_rng_state()
    with pytest.raises(peakcut.CaptureError):
        peakcut.capture(model, (x,), loss_fn, "adamw")
    assert torch.equal(torch.get_rng_state(), before)


class SeededOps(nn.Module):
    """Random ops outside the registry's list (PyTorch tags them nondeterministic_seeded),
    inside a checkpointed block: the recompute draws them again."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.randint(0, 2, x.shape, dtype=x.dtype)                   # aten.randint.low
        return self.fc(x * mask + torch.normal(torch.zeros_like(x), 0.1))    # aten.normal.Tensor_float

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.utils.checkpoint.checkpoint(self.block, self.fc(x), use_reentrant=False)


def test_every_op_that_draws_is_chained_with_the_generator_state_ops() -> None:
    from peakcut.ir.registry import draws_random

    g = peakcut.capture(SeededOps(), (torch.randn(2, 4),), loss_fn, "adamw")
    drawing = [nid for nid in g.order if draws_random(g.nodes[nid].op, g.nodes[nid].args, g.nodes[nid].kwargs)]
    ops = {g.nodes[nid].op for nid in drawing}
    assert {"aten.randint.low", "aten.normal.Tensor_float", "peakcut.set_rng_state.default"} <= ops
    for before, after in zip(drawing, drawing[1:], strict=False):
        assert before in g.control.get(after, ()), (g.nodes[before].op, g.nodes[after].op)
