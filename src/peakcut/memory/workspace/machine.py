"""What the CPU workspace rules read of the machine they model: the calibration seam.

`CpuMachine` holds every machine- and process-dependent input of the rules (intra-op
threads, ISA, oneDNN on/off, torch's default float dtype) and `OneDnnFit` the byte
counts fitted to oneDNN's scratchpads on the machine the rules were measured on
(docs/workspace.md). A calibration for another machine builds its own
`CpuMachine(..., fit=OneDnnFit(...))` and passes `CpuWorkspace(machine)` as the workspace
model; `CpuMachine.current()` describes the running process. Both are frozen and
hashable: they are the cache key of every workspace value computed with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

_onednn_available: Callable[[], bool] = torch.backends.mkldnn.is_available


@dataclass(frozen=True)
class OneDnnFit:
    """Bytes fitted to oneDNN 3.12's allocations (torch 2.13, AVX-512 with bf16, 2 cores);
    bench/calibrate_workspace.py re-measures them."""

    entry_pad: int = 128
    """oneDNN scratchpad booking adds ``max(alignment, 128)`` bytes to every entry."""
    wgrad_reduction_overhead: int = 8320
    """Fixed bytes booked next to the weight-gradient reduction buffer (barrier + bias reducer)."""
    cl_brgemm_scratch_base: int = 4096
    cl_brgemm_scratch_per_thread: int = 4096 + 24
    """Channels-last (brgemm) convolution scratchpad: ``base + nthreads * per_thread`` bytes."""
    brg_strided_base_f32: int = 12288
    brg_strided_base_bf16: int = 16384
    brg_strided_per_thread: int = 20480 + 24
    """Strided backward-data (brgconv_strided) scratchpad: ``base + nthreads * (one image of
    grad_output + per_thread)`` bytes; the fixed part is fitted (measured 8-70 KiB)."""
    bf16_wgrad_per_thread: int = 12288
    bf16_wgrad_1x1_overhead: int = 8192
    """bf16 weight gradient: per minibatch thread an fp32 weight accumulator and transposed copies
    of one image of input and grad_output, plus this many bytes."""
    matmul_scratch_base: int = 384
    matmul_scratch_per_thread: int = 640
    """bf16/f16 oneDNN matmul scratchpad: ``base + nthreads * (4 * min(M, 64) * min(N, 512) +
    per_thread)`` (+ terms for transposed or thin operands)."""


@dataclass(frozen=True)
class CpuMachine:
    """The CPU (and process settings) a workspace value is computed for."""

    threads: int
    """Intra-op threads (torch.get_num_threads()): per-thread buffers and oneDNN's balancers."""
    avx512: bool
    """PyTorch dispatches to AVX-512 (bf16 convolutions then always take oneDNN)."""
    onednn: bool
    """oneDNN (mkldnn) is available and enabled."""
    default_dtype: torch.dtype
    """torch.get_default_dtype(): the dtype a Python float takes as a tensor operand."""
    fit: OneDnnFit = field(default_factory=OneDnnFit)

    @classmethod
    def current(cls) -> CpuMachine:
        """This process's machine and settings, with the default fit."""
        return cls(
            threads=torch.get_num_threads(),
            avx512=torch.backends.cpu.get_cpu_capability().startswith("AVX512"),
            onednn=_onednn_available() and bool(torch.backends.mkldnn.enabled),
            default_dtype=torch.get_default_dtype(),
        )
