"""One configuration's step measured: its peak over one step and its times.

On a GPU: torch.cuda.max_memory_allocated and max_memory_reserved over one step (after
empty_cache and reset_peak_memory_stats: the whole process, weights and optimizer state
included), then each timed step by CUDA events on the current stream and by the wall clock
between two device-wide synchronizes (which waits for a plan's copy streams too). Without
CUDA, a dry run of the same code: the CPU allocator's events over one step plus the bytes
the caller holds stand for both peaks, and perf_counter for both clocks.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from peakcut.runtime import profiler_peak


def on_gpu() -> bool:
    return torch.cuda.is_available()


def device_name() -> str:
    return torch.cuda.get_device_name() if on_gpu() else "cpu (dry run)"


def release() -> None:
    """Memory a finished configuration left behind, back to the device."""
    gc.collect()
    if on_gpu():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def peak_of_one_step(step: Callable[[], Any], held_bytes: int) -> dict[str, int]:
    """max_memory_allocated / max_memory_reserved over one call of step, and what is allocated
    after it (module doc for the dry run)."""
    if not on_gpu():
        delta, _ = profiler_peak(step)
        return {"max_memory_allocated": held_bytes + delta, "max_memory_reserved": held_bytes + delta,
                "allocated_between_steps": held_bytes}
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return {"max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "allocated_between_steps": torch.cuda.memory_allocated()}


def timed(step: Callable[[], Any], runs: int) -> dict[str, Any]:
    """`runs` calls of step, each timed by CUDA events and by the wall clock (seconds)."""
    times, walls = [], []
    for _ in range(runs):
        if on_gpu():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()            # every stream: a plan's copy streams too
            walls.append(time.perf_counter() - t0)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
            walls.append(times[-1])
    return {"times_s": times, "median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "wall_times_s": walls, "wall_median_s": statistics.median(walls),
            "clock": "CUDA events" if on_gpu() else "perf_counter (dry run)"}


def measure(step: Callable[[], Any], runs: int, held_bytes: int) -> dict[str, Any]:
    """The peak over one step, then `runs` timed steps (the caller has run a warm-up)."""
    return {**peak_of_one_step(step, held_bytes), **timed(step, runs)}


def ratios(config: dict[str, Any], eager: dict[str, Any]) -> dict[str, float] | None:
    """config over eager: CUDA-event time, wall time, allocated and reserved peaks; None where
    either was not measured."""
    keys = ("median_s", "wall_median_s", "max_memory_allocated", "max_memory_reserved")
    if any(not isinstance(d.get(k), (int, float)) or not d.get(k) for d in (config, eager) for k in keys):
        return None
    return {"time": config["median_s"] / eager["median_s"], "wall": config["wall_median_s"] / eager["wall_median_s"],
            "allocated": config["max_memory_allocated"] / eager["max_memory_allocated"],
            "reserved": config["max_memory_reserved"] / eager["max_memory_reserved"]}
