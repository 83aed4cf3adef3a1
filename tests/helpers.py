"""Helpers shared by test modules."""

from __future__ import annotations

from dataclasses import replace

import torch

from peakcut.workloads import WorkloadInstance


def in_float64(inst: WorkloadInstance) -> WorkloadInstance:
    """The workload in float64: rounding of reordered or split sums sits far below the tolerances.

    In float32 a split sums a weight gradient in partial sums, and AdamW turns the rounding of
    gradient elements that are zero up to rounding into updates of about lr; in float64 both
    stay near 1e-13.
    """
    batch = tuple(t.double() if t.is_floating_point() else t for t in inst.batch)
    return replace(inst, model=inst.model.double(), batch=batch, dtype=torch.float64)


def cross_entropy_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """loss_fn for (inputs, class labels) batches."""
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


class MLP(torch.nn.Module):
    """Linear, LayerNorm, ReLU, Linear: the small model of the training-loop tests."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.norm(self.fc1(x))))


def make_mlp() -> tuple[MLP, tuple[torch.Tensor, torch.Tensor]]:
    """A seeded MLP and a batch of 6 rows, 4 classes."""
    torch.manual_seed(0)
    return MLP(), (torch.randn(6, 8), torch.randint(0, 4, (6,)))
