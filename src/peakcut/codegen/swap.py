"""Host memory at run time: swapped-out tensors (peakcut.store / peakcut.load nodes) and the
buffers of program inputs a plan keeps in host memory (codegen.update_inputs).

The code that stores and loads them is codegen.swap_code's.

How host copies are kept apart from device memory:

- The generated step takes a keyword `host`, a HostPool owned by the Step, and allocates every
  host copy through it. The pool counts the bytes of host copies alive (+ at allocation,
  - when the buffer is garbage-collected, via a weakref finalizer) and their peak, which
  Step exposes as `host_peak_bytes` after a run. Nothing is kept in module globals.
- On CPU the "host" is the same memory as the "device", so to keep the measured device peak
  (the c10 CPU allocator's events seen by torch.profiler, runtime.measure) free of host
  copies, the pool allocates them with numpy (np.empty) and wraps them with torch.from_numpy:
  PyTorch's allocator never sees them. A load allocates the device copy with
  torch.empty_strided (seen by the allocator, like any op output) and copies into it.
- On CUDA the pool allocates pinned host tensors (torch.empty_strided(..., pin_memory=True));
  torch.cuda.max_memory_allocated counts device memory only.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch._guards import detect_fake_mode

from peakcut.ir.graph import Graph
from peakcut.ir.ops import STORE_OP


class HostPool:
    """Host buffers of one program's swapped-out tensors, counted apart from device memory.

    live_bytes: bytes of host copies alive now; peak_bytes: their maximum since reset_peak().
    A buffer counts from its allocation until it is garbage (weakref finalizer), so the
    tally follows the program's `del`s. The counts are kept under a lock: the host stream's
    worker thread allocates buffers that the step's thread frees (codegen.host_worker).
    """

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0
        self._lock = threading.Lock()

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_bytes = self.live_bytes

    def empty_strided(self, shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                      pinned: bool = False) -> torch.Tensor:
        """An uninitialized host tensor with this layout (dense span: numel * itemsize bytes).

        pinned=False: numpy-backed, outside PyTorch's CPU allocator (invisible to its
        profiler events); pinned=True: page-locked via PyTorch, for async CUDA copies.
        """
        tensor, owner, nbytes = host_empty_strided(shape, stride, dtype, pinned)
        self._track(owner, nbytes)
        return tensor

    def _track(self, owner: Any, nbytes: int) -> None:
        with self._lock:
            self.live_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(owner, self._release, nbytes)

    def _release(self, nbytes: int) -> None:
        with self._lock:
            self.live_bytes -= nbytes


def host_empty_strided(shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                       pinned: bool) -> tuple[torch.Tensor, Any, int]:
    """(tensor, the object owning its memory, bytes): an uninitialized host tensor with this
    layout kept apart from device memory (module docstring): numpy-backed, or pinned."""
    if detect_fake_mode() is not None:
        raise NotImplementedError(
            "host memory under FakeTensors: the fake-tracker measurement does not yet keep "
            "host copies and host-kept state apart from device memory; measure such programs "
            "on a real device (method 'cpu-profiler' or 'cuda')")
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * dtype.itemsize
    if pinned:
        tensor = torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device="cpu",
                                     pin_memory=True)
        return tensor, tensor.untyped_storage(), nbytes
    raw = np.empty(nbytes, dtype=np.uint8)
    return torch.from_numpy(raw).view(dtype).as_strided(tuple(shape), tuple(stride)), raw, nbytes


def host_copy(t: torch.Tensor, pinned: bool) -> torch.Tensor:
    """A copy of t (dense, non-overlapping) in host memory kept apart from device memory."""
    out, _, _ = host_empty_strided(t.shape, t.stride(), t.dtype, pinned)
    out.copy_(t)
    return out


def simulated_host_peak(g: Graph, order: Sequence[int]) -> int:
    """Peak bytes of host copies when the generated program runs `order` on CPU (what HostPool
    should measure): a host storage the step allocates (a store's copy, the result of an op on
    the host) lives from the node that makes it to the last node touching it."""
    pos = {nid: i for i, nid in enumerate(order)}
    held = g.caller_held_storages()
    made: dict[int, int] = {}       # storage -> position of the node that allocates it
    last: dict[int, int] = {}       # storage -> position of the last node touching it
    for nid in order:
        node = g.nodes[nid]
        i = pos[nid]
        if node.op == STORE_OP or node.tags.on_host:
            for t in node.output_ids():
                s = g.tensors[t].storage
                if s not in held and s not in made:
                    made[s] = i
        for t in (*node.input_ids(), *node.output_ids()):
            s = g.tensors[t].storage
            if s in made:
                last[s] = i
    delta = [0] * (len(order) + 1)
    for s, i in made.items():
        delta[i] += g.storages[s]
        delta[last[s] + 1] -= g.storages[s]
    live = peak = 0
    for d in delta:
        live += d
        peak = max(peak, live)
    return peak
