"""The CUDA workspace model: measured on the GPU at hand, chosen for plans priced on a GPU.

Without a CUDA device only the refusals and the CPU choice are checked here; the GPU checks
run where torch.cuda.is_available() (a machine with an NVIDIA GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import peakcut
from peakcut.cost import get_cost_model
from peakcut.memory import simulate
from peakcut.memory.workspace import (
    CalibratedCudaWorkspace,
    describe_workspace,
    measure_cuda_calls,
    order_workspace,
    workspace_model,
)
from peakcut.optimizer.api import workspace_for
from tests.helpers import cross_entropy_loss

aten = torch.ops.aten
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_the_cuda_model_needs_a_cuda_device() -> None:
    with pytest.raises(ValueError, match="CUDA device"):
        workspace_model("cuda")
    with pytest.raises(ValueError, match="CUDA device"):
        CalibratedCudaWorkspace.for_device("cpu")


def test_a_plan_priced_on_a_cpu_or_a_device_profile_keeps_the_cpu_model() -> None:
    assert workspace_for(get_cost_model("measured:cpu")) == "cpu"
    assert workspace_for(get_cost_model("h200")) == "cpu"


def _cuda_cnn() -> tuple[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).cuda()
    batch = (torch.randn(16, 3, 64, 64, device="cuda"), torch.randint(0, 10, (16,), device="cuda"))
    return model, batch


@cuda
def test_measure_cuda_calls_is_the_allocator_peak_beyond_what_the_call_returns() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    a = torch.ones(256, 256, device=dev)
    mm = lambda: aten.mm.default(a, a)  # noqa: E731
    scratch = lambda: (aten.mm.default(a, a) * 2).sum()  # noqa: E731   a 256 KiB temporary, freed
    mm()
    scratch()
    got = measure_cuda_calls([mm, scratch], dev)
    assert got[0] == 0
    assert got[1] >= 256 * 256 * 4


@cuda
def test_a_cuda_step_is_measured_once_and_cached(tmp_path: Path) -> None:
    model, batch = _cuda_cnn()
    g = peakcut.capture(model, batch, cross_entropy_loss, "adamw")
    first = CalibratedCudaWorkspace.for_device("cuda", cache_dir=tmp_path)
    ws = order_workspace(g, g.order, first)
    entries = first.entries()
    assert entries and all(e.measured for e in entries.values())
    saved = json.loads((tmp_path / first.fingerprint.file_name()).read_text())
    assert saved["fingerprint"] == first.fingerprint.as_dict()
    assert "cudnn" in first.fingerprint.device
    assert (order_workspace(g, g.order, first) == ws).all()
    assert "measured on this GPU" in describe_workspace(first)


@cuda
def test_the_simulated_cuda_peak_is_the_measured_one() -> None:
    """The generated step's max_memory_allocated against the simulation with the GPU's model:
    apart by the allocator's 512-byte rounding of each block (at most 511 bytes per storage)."""
    model, batch = _cuda_cnn()
    g = peakcut.capture(model, batch, cross_entropy_loss, "adamw")
    measured = peakcut.measure(peakcut.build(g), model, batch, repeats=1).peak_bytes
    simulated = simulate(g, workspace="cuda").peak_bytes
    assert abs(simulated - measured) <= 512 * len(g.storages)


@cuda
def test_optimize_on_a_gpu_uses_and_reports_the_gpu_model() -> None:
    model, batch = _cuda_cnn()
    assert isinstance(workspace_for(get_cost_model("measured")), CalibratedCudaWorkspace)
    plan = peakcut.optimize(model, batch, cross_entropy_loss, torch.optim.AdamW(model.parameters()),
                            device="measured", time_budget=20)
    assert "cuda workspace measured on this GPU" in plan.report["memory_method"]
