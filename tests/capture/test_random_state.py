"""Random numbers the step draws: what capture refuses, by name, before anything runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peakcut


class Noisy(nn.Module):
    def __init__(self, generator: torch.Generator | None = None, reseed: bool = False) -> None:
        super().__init__()
        self.fc, self.generator, self.reseed = nn.Linear(4, 4), generator, reseed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reseed:
            torch.manual_seed(3)
        if self.generator is not None:
            x = x + torch.randn(x.shape, generator=self.generator)
        return self.fc(x)


def loss_fn(m: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
    return m(batch[0]).pow(2).mean()


@pytest.mark.parametrize("model, words", [
    (Noisy(generator=torch.Generator().manual_seed(1)), ["aten.randn.generator", "torch.Generator"]),
    (Noisy(reseed=True), ["torch.manual_seed"]),
], ids=["own generator", "manual_seed"])
def test_draws_the_step_cannot_repeat_are_refused_by_name(model: nn.Module, words: list[str]) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(peakcut.CaptureError) as e:
        peakcut.optimize(model, (torch.randn(2, 4),), loss_fn, opt, time_budget=5, max_states=2, device="h200")
    assert all(w in str(e.value) for w in words), str(e.value)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True))
    assert not opt.state
