"""The CUDA workspace model: every distinct call measured on the GPU at hand, cached per GPU.

    model = CalibratedCudaWorkspace.for_device("cuda:0")     # what the spec "cuda" resolves to
    model.nodes_bytes(g, nodes, rules)                       # measures the calls it has not seen

On a GPU the scratch memory of a call is what the CUDA caching allocator hands out while it
runs beyond what it still holds when it returns: cuDNN's convolution workspace (with the
heuristics' algorithm, or cudnn.benchmark's), the temporaries of sorts, scans and
reductions, a cuBLAS call's split-K buffers. The CPU model's oneDNN rules say nothing about
these: on an NVIDIA H200 at paper size, eager U-Net's max_memory_allocated was 22.70 GiB
against 11.73 GiB simulated with the CPU model (BENCHMARKS.md, "On an NVIDIA H200").

Each distinct call (peakcut.cost.calls.call_key) is run once on synthetic inputs
(peakcut.cost.inputs) as a warm-up (cuDNN plans, cuBLAS handles and their persistent
workspace, lazy module loading: one-time allocations not counted), then once between
torch.cuda.reset_peak_memory_stats and max_memory_allocated; its workspace is that peak
minus memory_allocated after the call (its outputs and inputs still held). The allocator
rounds every block to 512 bytes; the simulators count exact storage bytes, at most 511
bytes a tensor apart.

Measuring resets the device's peak memory statistics (torch.cuda.reset_peak_memory_stats):
read max_memory_allocated after peakcut.optimize, not across it. Calls whose tensors exceed
max_call_bytes (default: 1/16 of the device's memory), and
calls that raise on synthetic inputs, take 0 bytes (no analytic CUDA rules); each entry
records why. Tables are cached per GPU fingerprint (device name and compute capability,
CUDA and cuDNN versions, the cuDNN and TF32 flags, PyTorch version) in
``$PEAKCUT_CACHE/workspace/cuda-<hash>.json``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from peakcut.cost.cache import cache_root
from peakcut.cost.fingerprint import Fingerprint, device_fingerprint
from peakcut.memory.workspace.measured import SCHEMA_VERSION, CalibratedWorkspace, WorkspaceEntry

MEMORY_SHARE = 16
"""A call measured may hold at most 1 / MEMORY_SHARE of the device's memory in tensors (8.7 GiB
on a 139 GiB H200): the model, its optimizer state and the search's own tensors share it."""


def cuda_workspace_fingerprint(device: torch.device) -> Fingerprint:
    """The GPU and the settings that pick its kernels: device name and capability (the
    timing fingerprint), CUDA and cuDNN versions, cudnn.enabled / benchmark / deterministic,
    TF32 for matmuls and convolutions."""
    base = device_fingerprint(device, SCHEMA_VERSION)
    cudnn = torch.backends.cudnn
    version = cudnn.version() if cudnn.is_available() else "none"  # type: ignore[no-untyped-call]
    extra = (f"; cuda {torch.version.cuda}, cudnn {version} "
             f"(enabled {cudnn.enabled}, benchmark {cudnn.benchmark}, deterministic {cudnn.deterministic}, "
             f"tf32 {cudnn.allow_tf32}), matmul tf32 {torch.backends.cuda.matmul.allow_tf32}")
    return Fingerprint(device=base.device + extra, torch=base.torch, schema=base.schema)


def measure_cuda_calls(calls: list[Callable[[], Any]], device: torch.device) -> list[int]:
    """Workspace bytes of each call on `device` (module docstring); each has run once."""
    out = []
    for call in calls:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = call()
        torch.cuda.synchronize(device)
        out.append(max(0, torch.cuda.max_memory_allocated(device) - torch.cuda.memory_allocated(device)))
        del result
    return out


class CalibratedCudaWorkspace(CalibratedWorkspace):
    """Workspace of calls measured on one CUDA device (module docstring), cached on disk."""

    label = "calibrated-cuda"

    @classmethod
    def for_device(cls, device: str | torch.device = "cuda", cache_dir: Path | None = None,
                   max_call_bytes: int | None = None) -> CalibratedCudaWorkspace:
        """The model of `device` with this process's settings (one instance per cache file).
        Raises ValueError when there is no such CUDA device."""
        dev = torch.device(device)
        if dev.type != "cuda" or not torch.cuda.is_available():
            raise ValueError(f"the 'cuda' workspace model measures on a CUDA device; {device!r} is not one here "
                             f"(torch.cuda.is_available() is {torch.cuda.is_available()})")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise ValueError(f"no CUDA device {dev}: this machine has {torch.cuda.device_count()}")
        if max_call_bytes is None:
            max_call_bytes = torch.cuda.get_device_properties(dev).total_memory // MEMORY_SHARE
        fingerprint = cuda_workspace_fingerprint(dev)
        directory = cache_root() / "workspace" if cache_dir is None else Path(cache_dir)
        return _instance(fingerprint, directory / fingerprint.file_name(), max_call_bytes, dev)

    def describe(self) -> str:
        """Which model this is, for reports."""
        return (f"cuda workspace measured on this GPU ({self.fingerprint.device}): {self.table_summary()}; "
                "those take 0 bytes")

    def can_measure(self) -> bool:
        """False while a CUDA graph is being captured on the current stream (a measured call
        would be captured into it)."""
        return not torch.cuda.is_current_stream_capturing()

    def _record(self, batch: list[tuple[str, Callable[[], Any]]]) -> None:
        # each call has just run once (the trial in _measure): that was its warm-up
        for (key, _), nbytes in zip(batch, measure_cuda_calls([c for _, c in batch], self.device), strict=True):
            self._entries[key] = WorkspaceEntry(nbytes)


@functools.cache
def _instance(fingerprint: Fingerprint, path: Path, max_call_bytes: int,
              device: torch.device) -> CalibratedCudaWorkspace:
    return CalibratedCudaWorkspace(fingerprint, path, max_call_bytes, device)
