"""Eager step time and peak of every workload at medium size, measured on this machine.

    python -m bench.medium_sizes [workload ...]
    python -m bench.medium_sizes bert-base:4,8,12 vit-base:4,6,8     # other batch sizes

The user's eager loop (zero grads, loss, backward, torch.optim.AdamW step) on the medium
instance: one warm-up step, then the median (min, max) of 3 timed steps; peak = parameters,
buffers and optimizer state held between steps plus the CPU allocator's peak during one
more step (torch.profiler memory events); glibc's malloc keeps freed memory, as under
peakcut.optimize and bench.measured. The medium size is meant to take about 0.3-3 s
and 1-6 GB here (peakcut.workloads.base). "held / peak" is the share of eager's peak that
stays in memory between steps: on a CPU no plan can go below it (optimizer/held_floor.py), so
it says at which batch sizes a 0.6x-of-eager target is not excluded by physics alone.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time

import torch

from peakcut.runtime import keep_freed_host_memory
from peakcut.runtime.measure import profiler_peak
from peakcut.workloads import WORKLOAD_NAMES, get_workload


def row(name: str, batch_size: int | None = None) -> str:
    inst = get_workload(name).build("medium", batch_size=batch_size)
    model = inst.model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        inst.loss_fn(model, inst.batch).backward()
        opt.step()

    step()
    held = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in (*model.parameters(), *model.buffers(),
                      *(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)))}
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    peak, _ = profiler_peak(step)
    total = sum(held.values()) + peak
    held_bytes = sum(held.values())
    return (f"| {inst.description} | {statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f}) | "
            f"{held_bytes / 2**30:.2f} | {total / 2**30:.2f} | {held_bytes / total:.2f} |")


def main(names: list[str]) -> None:
    kept = keep_freed_host_memory()      # as under peakcut.optimize and bench.measured
    print(f"glibc malloc keeps freed memory: {kept}.")
    print(f"Measured on {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}.\n")
    print("| workload (medium) | eager step s, median (min-max) of 3 | held GiB | peak GiB | held / peak |")
    print("|---|---|---|---|---|")
    for arg in names or WORKLOAD_NAMES:
        name, _, sizes = arg.partition(":")
        for size in sizes.split(",") if sizes else [""]:
            print(row(name, int(size) if size else None), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
