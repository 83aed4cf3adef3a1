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
torch.cuda.reset_peak_memory_stats and the allocator's statistics; its workspace is the
peak of requested bytes during the call minus the requested bytes after it (its outputs and
inputs still held): requested, not allocated, because the allocator rounds blocks up and
may hand out a cached block up to 1 MiB larger than asked, which the simulators (exact
storage bytes) do not count.

Measuring resets the device's peak memory statistics (torch.cuda.reset_peak_memory_stats):
read max_memory_allocated after peakcut.optimize (or a plan's first step on a new batch
shape, which plans again), not across it. Calls whose tensors exceed max_call_bytes
(default: 1/16 of the device's memory) or a quarter of its free memory, calls of ops whose
kernels assert on input values (VALUE_CHECKED_OPS: a device-side assert would end the
process's CUDA context), and calls that raise on synthetic inputs take 0 bytes (there are no
analytic CUDA rules); each entry records why, and only measured ones are saved. Tables are
cached per GPU fingerprint (device name and compute capability, CUDA and cuDNN versions,
the cuDNN flags, TF32 settings, PYTORCH_CUDA_ALLOC_CONF, PyTorch version) in
``$PEAKCUT_CACHE/workspace/cuda-<hash>.json``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from peakcut.cost.cache import cache_root
from peakcut.cost.fingerprint import Fingerprint, device_fingerprint
from peakcut.cost.inputs import VALUE_CHECKED_OPS, error_line
from peakcut.memory.workspace.measured import SCHEMA_VERSION, CalibratedWorkspace, WorkspaceEntry

MEMORY_SHARE = 16
"""A call measured may hold at most 1 / MEMORY_SHARE of the device's memory in tensors (8.7 GiB
on a 139 GiB H200): the model, its optimizer state and the search's own tensors share it."""


def _tf32(flags: Any, legacy: str) -> str:
    """A TF32 setting as PyTorch reports it: fp32_precision where this PyTorch has it (reading
    the legacy allow_tf32 raises after the new API set it), else allow_tf32."""
    try:
        precision = getattr(flags, "fp32_precision", None)
        return str(precision) if precision is not None else f"{legacy} {getattr(flags, legacy)}"
    except RuntimeError as e:
        return f"unreadable ({error_line(e)})"


def cuda_workspace_fingerprint(device: torch.device) -> Fingerprint:
    """The GPU and the settings that pick its kernels: device name and capability (the
    timing fingerprint), CUDA and cuDNN versions, cudnn.enabled / benchmark / deterministic,
    TF32 for matmuls and convolutions."""
    base = device_fingerprint(device, SCHEMA_VERSION)
    cudnn = torch.backends.cudnn
    version = cudnn.version() if cudnn.is_available() else "none"  # type: ignore[no-untyped-call]
    conv = getattr(cudnn, "conv", cudnn)
    extra = (f"; cuda {torch.version.cuda}, cudnn {version} "
             f"(enabled {cudnn.enabled}, benchmark {cudnn.benchmark}, deterministic {cudnn.deterministic}, "
             f"convolutions {_tf32(conv, 'allow_tf32')}), matmul {_tf32(torch.backends.cuda.matmul, 'allow_tf32')}, "
             f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', 'unset')}")
    return Fingerprint(device=base.device + extra, torch=base.torch, schema=base.schema)


def measure_cuda_calls(calls: list[Callable[[], Any]], device: torch.device) -> list[int]:
    """Workspace bytes of each call on `device` (module docstring); each has run once.

    Counted in requested bytes (what the ops asked the caching allocator for, as the
    simulators count storages), not in the allocated blocks, which the allocator rounds up
    and may hand out with up to 1 MiB more from a cached block; allocated bytes where this
    PyTorch does not keep requested ones."""
    out = []
    for call in calls:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = call()
        torch.cuda.synchronize(device)
        stats = torch.cuda.memory_stats(device)
        kind = "requested_bytes" if "requested_bytes.all.peak" in stats else "allocated_bytes"
        out.append(max(0, int(stats[f"{kind}.all.peak"]) - int(stats[f"{kind}.all.current"])))
        del result
    return out


class CalibratedCudaWorkspace(CalibratedWorkspace):
    """Workspace of calls measured on one CUDA device (module docstring), cached on disk."""

    spec = "cuda"

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

    def _why_not_run(self, op: str, size: int) -> str:
        """Ops whose CUDA kernels check their inputs' values with device-side asserts (an
        assert ends the process's CUDA context; synthetic inputs are |randn|, not
        probabilities), and calls that would take more than a quarter of the free memory."""
        if op in VALUE_CHECKED_OPS:
            return f"{op} checks its input values with device-side asserts: not run on synthetic inputs"
        free = torch.cuda.mem_get_info(self.device)[0]
        if size > free // 4:
            return f"tensors of {size} bytes exceed a quarter of the {free} bytes free on the device"
        return ""

    def _trial(self, call: Callable[[], Any]) -> None:
        call()
        torch.cuda.synchronize(self.device)     # an asynchronous error surfaces here, inside the try

    def _record(self, batch: list[tuple[str, Callable[[], Any]]]) -> None:
        # each call has just run once (the trial in _measure): that was its warm-up
        for key, call in batch:
            try:
                (nbytes,) = measure_cuda_calls([call], self.device)
            except torch.cuda.OutOfMemoryError as e:      # the batch's inputs held beside it
                self._entries[key] = WorkspaceEntry(0, False, error_line(e))
                continue
            self._entries[key] = WorkspaceEntry(nbytes)


@functools.cache
def _instance(fingerprint: Fingerprint, path: Path, max_call_bytes: int,
              device: torch.device) -> CalibratedCudaWorkspace:
    return CalibratedCudaWorkspace(fingerprint, path, max_call_bytes, device)
