"""The CUDA workspace model: measured on the GPU at hand, the model of every graph on a GPU.

Without a CUDA device only the refusals and the CPU choice are checked here; the GPU checks
run where torch.cuda.is_available() (a machine with an NVIDIA GPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import peakcut
from peakcut.memory import simulate
from peakcut.memory.workspace import (
    CalibratedCpuWorkspace,
    CalibratedCudaWorkspace,
    describe_workspace,
    measure_cuda_calls,
    model_name,
    order_workspace,
    workspace_model,
)
from tests.helpers import cross_entropy_loss

aten = torch.ops.aten
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_the_cuda_model_needs_a_cuda_device() -> None:
    with pytest.raises(ValueError, match="CUDA device"):
        workspace_model("cuda")
    with pytest.raises(ValueError, match="CUDA device"):
        CalibratedCudaWorkspace.for_device("cpu")


def test_auto_is_the_model_of_the_graphs_device(small_cnn: tuple) -> None:
    """"auto" (every default): this CPU's calibrated model for a graph on the CPU or the meta
    device, and for a CUDA graph where there is no such GPU; the GPU's own where there is."""
    assert workspace_model("auto") is workspace_model("cpu") is workspace_model("auto", "meta")
    on_cuda = workspace_model("auto", "cuda:0")
    if torch.cuda.is_available():
        assert isinstance(on_cuda, CalibratedCudaWorkspace) and model_name(on_cuda) == "cuda"
    else:
        assert isinstance(on_cuda, CalibratedCpuWorkspace) and model_name(on_cuda) == "cpu"
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cross_entropy_loss, "adamw")
    assert simulate(g).peak_bytes == simulate(g, workspace="cpu").peak_bytes
    assert "(simulated, cpu workspace model)" in peakcut.build(g).source


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
    profile = simulate(g)                      # "auto": the GPU's model for a graph on the GPU
    # max_memory_allocated counts blocks: rounded up to 512 B, and a cached block may be up
    # to 1 MiB larger than asked; the simulation counts the storages' own bytes
    assert abs(measured - profile.peak_bytes) <= (1 << 20) * len(profile.hotspots)


@cuda
def test_optimize_on_a_gpu_uses_and_reports_the_gpu_model() -> None:
    model, batch = _cuda_cnn()
    try:
        plan = peakcut.optimize(model, batch, cross_entropy_loss, torch.optim.AdamW(model.parameters()),
                                device="measured", time_budget=20)
    except peakcut.LimitNotMet as e:       # what is checked is the model used, not the plan found
        plan = e.plan
    assert "cuda workspace measured on this GPU" in plan.report["memory_method"]
    assert "(simulated, cuda workspace model)" in plan.source
