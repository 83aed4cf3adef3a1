"""Helpers shared by test modules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

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


class _DenseLayer(torch.nn.Module):
    def __init__(self, channels: int, growth: int) -> None:
        super().__init__()
        self.norm1, self.conv1 = torch.nn.BatchNorm2d(channels), torch.nn.Conv2d(channels, 2 * growth, 1, bias=False)
        self.norm2, self.conv2 = torch.nn.BatchNorm2d(2 * growth), torch.nn.Conv2d(2 * growth, growth, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv1(torch.relu(self.norm1(x)))
        return torch.cat([x, self.conv2(torch.relu(self.norm2(out)))], 1)


class TinyDenseNet(torch.nn.Module):
    """Two dense blocks of DenseNet-BC layers joined by a transition (BN-ReLU-conv-avgpool)."""

    def __init__(self, growth: int = 4, classes: int = 5) -> None:
        super().__init__()
        self.stem, self.stem_norm = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8)
        self.block1 = torch.nn.Sequential(*(_DenseLayer(8 + i * growth, growth) for i in range(3)))
        c = 8 + 3 * growth
        self.transition = torch.nn.Sequential(torch.nn.BatchNorm2d(c), torch.nn.ReLU(), torch.nn.Conv2d(c, c // 2, 1, bias=False),
                                        torch.nn.AvgPool2d(2))
        self.block2 = torch.nn.Sequential(*(_DenseLayer(c // 2 + i * growth, growth) for i in range(2)))
        self.final_norm = torch.nn.BatchNorm2d(c // 2 + 2 * growth)
        self.head = torch.nn.Linear(c // 2 + 2 * growth, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block1(torch.relu(self.stem_norm(self.stem(x))))
        x = self.block2(self.transition(x))
        return self.head(torch.relu(self.final_norm(x)).mean((2, 3)))


def tiny_densenet() -> tuple[TinyDenseNet, tuple[torch.Tensor, torch.Tensor], object]:
    """A seeded float64 TinyDenseNet, a batch of 4 images of 12x12, and its loss_fn."""
    torch.manual_seed(0)
    return (TinyDenseNet().double(), (torch.randn(4, 3, 12, 12, dtype=torch.float64),
                                      torch.randint(0, 5, (4,))), cross_entropy_loss)


def step_against_eager(plan: Any, model: torch.nn.Module, opt: torch.optim.Optimizer, ref: torch.nn.Module,
                       ref_opt: torch.optim.Optimizer, loss_fn: Callable[..., torch.Tensor], batches: Sequence[Any],
                       tol: float) -> None:
    """Step `plan` and the reference eager loop (ref, ref_opt) on each batch; the losses, then
    the parameters and the optimizer state, equal within `tol`."""
    for k, batch in enumerate(batches):
        loss = plan.step(batch)
        ref_loss = loss_fn(ref, batch)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=tol, atol=tol, msg=lambda m, k=k: f"step {k}: {m}")
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol)
    for i, slots in ref_opt.state_dict()["state"].items():
        for key, value in slots.items():
            torch.testing.assert_close(opt.state_dict()["state"][i][key], value, rtol=tol, atol=tol)
