"""Capturing a model that uses activation checkpointing (its recomputation runs in the backward)."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import peakcut
from tests.helpers import cross_entropy_loss


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(3))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def test_a_checkpointed_model_is_captured_with_its_recomputation() -> None:
    torch.manual_seed(0)
    model = Checkpointed()
    batch = (torch.randn(8, 16), torch.randint(0, 4, (8,)))
    g = peakcut.capture(model, batch, cross_entropy_loss, "adamw", keep_grads=True)
    matmuls = [n for n in g.nodes.values() if n.op == "aten.addmm.default"]
    assert len(matmuls) == 4 + 3   # the forward's, then each block's linear recomputed in the backward
    report = peakcut.check_equivalence(model, batch, cross_entropy_loss, peakcut.AdamW(),
                                       lambda _m: peakcut.build(g), steps=2)
    assert report.ok, report
