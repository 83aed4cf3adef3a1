"""The allocation sequence of a step, and the bytes an allocator model reserves for it.

    requests = step_requests(life, workspace, steps=2)
    found = predict_reserved(life, workspace, device="cuda")      # Reserved(peak_reserved, ...)

The sequence (storages named by their id, a node's transient workspace by -(position + 1)):
the caller's storages first (parameters, batch, optimizer state, held between steps), then
`steps` steps, each the curve points of peakcut.memory.lifetimes in order: where a node
starts, the storages it allocates (in the order it first touches them) and then its
workspace; where it ends, its workspace freed and then the storages it frees. The storages
of program outputs are freed at the end of each step (the caller drops the loss). A
request of 0 bytes makes no block and is left out. Replayed on the CUDA caching allocator
model (caching_allocator.CachingAllocatorModel) for a GPU, on the host heap model
(host_heap.HostHeapModel) for a CPU: glibc keeping freed memory (host_keeps_freed, as
peakcut.optimize sets it up to measure) or its default policy; the peaks over all steps are
max_memory_reserved (on a CPU, the most resident bytes) and max_memory_allocated. Two steps
by default: what the first leaves cached (or raises glibc's thresholds to) shapes the second.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from peakcut.memory.caching_allocator import AllocatorConfig, CachingAllocatorModel
from peakcut.memory.host_heap import HostHeapModel
from peakcut.memory.lifetimes import Lifetimes
from peakcut.memory.liveness import Int64Array

FREE = -1        # a request's bytes when it frees its key


@dataclass(frozen=True)
class Reserved:
    """What an allocator model predicts for a step: peak reserved and allocated bytes, and
    how (the model and the sequence)."""

    peak_reserved: int
    peak_allocated: int
    method: str


def step_requests(life: Lifetimes, workspace: Int64Array | None = None, steps: int = 2) -> list[tuple[int, int]]:
    """(key, bytes) requests of the module doc, bytes FREE to free the key."""
    if steps < 1:
        raise ValueError(f"steps={steps}: expected at least one step")
    n = len(life.node_start)
    ws = np.zeros(n, dtype=np.int64) if workspace is None else np.asarray(workspace, dtype=np.int64)
    if len(ws) != n:
        raise ValueError(f"workspace has {len(ws)} entries, the order has {n} nodes")
    events: list[tuple[int, int, int, int, int]] = []       # (point, phase, rank, key, bytes)
    storages = life.storages
    for k, (at, size) in enumerate(zip(life.alloc_at.tolist(), life.size.tolist(), strict=True)):
        if size:
            events.append((at, 0, k, storages[k], size))
    for i in np.flatnonzero(ws).tolist():
        events.append((int(life.node_start[i]), 1, i, -(i + 1), int(ws[i])))
        events.append((int(life.node_end[i]), 2, i, -(i + 1), FREE))
    outputs = []
    for k, (until, size) in enumerate(zip(life.free_at.tolist(), life.size.tolist(), strict=True)):
        if not size:
            continue
        if until >= life.points:
            outputs.append(storages[k])
        else:
            events.append((until, 3, k, storages[k], FREE))
    events.sort()
    step = [(key, nbytes) for _, _, _, key, nbytes in events] + [(key, FREE) for key in outputs]
    held = [(s, size) for s, size in zip(life.held, life.held_size.tolist(), strict=True) if size]
    return held + step * steps


def predict_reserved(life: Lifetimes, workspace: Int64Array | None = None, *, device: str = "cuda",
                     config: AllocatorConfig | None = None, steps: int = 2,
                     host_keeps_freed: bool = False) -> Reserved:
    """Replay step_requests on the allocator model of `device` ("cuda" or "cpu"; on a CPU,
    glibc keeping freed memory where `host_keeps_freed`, else its defaults); module doc."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device={device!r}: expected 'cuda' or 'cpu'")
    model: CachingAllocatorModel | HostHeapModel
    if device == "cuda":
        model = CachingAllocatorModel(config)
        how = "CUDA caching allocator model"
        cfg = model.config
        if cfg.expandable_segments or cfg.max_split_size is not None:
            how += f" ({'expandable segments' if cfg.expandable_segments else 'fixed segments'}, " \
                   f"max_split_size {cfg.max_split_size})"
    else:
        model = HostHeapModel(keeps_freed=host_keeps_freed)
        how = ("host heap model (glibc keeping freed memory: best fit, merging, the heap's high-water mark)"
               if host_keeps_freed else
               "host heap model (glibc's defaults: mmap above the dynamic mmap threshold, best fit, merging, "
               "the top trimmed)")
    for key, nbytes in step_requests(life, workspace, steps):
        if nbytes == FREE:
            model.free(key)
        else:
            model.malloc(key, nbytes)
    return Reserved(peak_reserved=model.peak_reserved, peak_allocated=model.peak_allocated,
                    method=f"{how}, {steps} steps of the order's allocations replayed")
