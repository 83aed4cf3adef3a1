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
