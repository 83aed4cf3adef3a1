"""Shared fixtures: generated programs go to a temporary cache; small models. Parallel test
workers share the cores (pytest_configure)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from tests.helpers import cross_entropy_loss


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker takes its share of torch's intra-op threads. Two
    workers on CI's 2 cores at 2 threads each oversubscribe them: every OpenMP region then
    waits a scheduler slice for a thread the other worker holds, and the tests that time
    calls (the measured cost model, the calibration, the verification) retried until they
    took 50 s where they take 1 s alone (the suite: 564 s -> 370 s at one thread each)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        torch.set_num_threads(max(1, torch.get_num_threads() // workers))


@pytest.fixture(autouse=True)
def _program_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PEAKCUT_CACHE", str(tmp_path_factory.getbasetemp() / "peakcut-cache"))


class SmallCNN(nn.Module):
    """Conv (no bias) + BatchNorm + ReLU + Linear + LayerNorm: in-place buffers and multi-output ops."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 8 * 8, 5)
        self.ln = nn.LayerNorm(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return self.ln(self.fc(y.flatten(1)))


cnn_loss = cross_entropy_loss


@pytest.fixture
def small_cnn() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = SmallCNN()
    batch = (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,)))
    return model, batch
