"""A small captured step for the matcher and substitution tests: ReLU, an attention-like
softmax of h h^T, a concatenation sliced back, a slice across the parts, a row sum."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import peakcut
from peakcut.ir.graph import Graph

SGD = peakcut.SGD(lr=1e-2, momentum=0.9)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.v = nn.Parameter(torch.randn(8, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(x @ self.w)
        y = torch.softmax(h @ h.t(), dim=-1) @ h
        y = torch.cat([y, x], dim=1)[:, :8]
        z = torch.cat([y, x], dim=1)[:, 3:9]              # a slice across the parts: no op of ours
        return ((y @ self.v).sum(dim=1, keepdim=True).sum()
                + torch.nn.functional.gelu(z, approximate="tanh").sum())


def toy_loss(model: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
    return model(*batch)


@pytest.fixture(scope="package")
def toy() -> tuple[nn.Module, tuple[torch.Tensor], Callable[..., Any], Graph]:
    """(model, batch, loss_fn, its SGD step captured with the gradients kept)."""
    torch.manual_seed(0)
    model = Toy()
    batch = (torch.randn(6, 8),)
    return model, batch, toy_loss, peakcut.capture(model, batch, toy_loss, SGD, keep_grads=True)
