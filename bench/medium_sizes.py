"""Eager step time and peak of every workload at medium size, measured on this machine.

    python -m bench.medium_sizes [workload ...]

The user's eager loop (zero grads, loss, backward, torch.optim.AdamW step) on the medium
instance: one warm-up step, then the median (min, max) of 3 timed steps; peak = parameters,
buffers and optimizer state held between steps plus the CPU allocator's peak during one
more step (torch.profiler memory events). The medium size is meant to take about 0.3-3 s
and 1-6 GB here (peakcut.workloads.base).
"""

from __future__ import annotations

import platform
import statistics
import sys
import time

import torch

from peakcut.runtime.measure import profiler_peak
from peakcut.workloads import WORKLOAD_NAMES, get_workload


def row(name: str) -> str:
    inst = get_workload(name).build("medium")
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
    return (f"| {inst.description} | {statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f}) | "
            f"{sum(held.values()) / 2**30:.2f} | {total / 2**30:.2f} |")


def main(names: list[str]) -> None:
    print(f"Measured on {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}.\n")
    print("| workload (medium) | eager step s, median (min-max) of 3 | held GiB | peak GiB |")
    print("|---|---|---|---|")
    for name in names or WORKLOAD_NAMES:
        print(row(name), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
