"""Re-ordering alone: simulated peak of the eager (capture) order vs peakcut's schedule.

    python -m bench.reorder > bench/reorder.md

Every figure is simulated (spine memory model, CPU workspace model) on graphs
captured over FakeTensors; nothing is run. Paper size and batch 1 (OLLA's two
anchors are batch 1 and batch 32), AdamW. The lower bound is order-free: the
bytes live at some op in every topological order (an allocating op before it,
a reader after it), so no re-ordering can go below it. Schedule time is wall
time on this machine, including the lower bound.
"""

from __future__ import annotations

import platform
import time

import torch

import peakcut
from peakcut.schedule import schedule
from peakcut.workloads import WORKLOAD_NAMES, get_workload


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f}"


def rows(batch_size: int | None) -> tuple[list[str], list[float]]:
    out = ["| workload | ops | eager peak GiB | re-ordered GiB | reduction | lower bound GiB | "
           "gap to bound | method | schedule s |", "|---|---|---|---|---|---|---|---|---|"]
    reductions = []
    for name in WORKLOAD_NAMES:
        inst = get_workload(name).build("paper", batch_size=batch_size)
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        t0 = time.perf_counter()
        s = schedule(g, time_limit=20.0)
        seconds = time.perf_counter() - t0
        reductions.append(s.reduction)
        gap = (s.peak_bytes - s.lower_bound_bytes) / s.peak_bytes
        out.append(f"| {inst.description} | {len(g.nodes)} | {_gib(s.eager_peak_bytes)} | {_gib(s.peak_bytes)} | "
                   f"{s.reduction:.2%} | {_gib(s.lower_bound_bytes)} | {gap:.2%} | {s.method} | {seconds:.1f} |")
    return out, reductions


def main() -> None:
    print(f"Environment: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, peakcut {peakcut.__version__}. All peaks simulated.\n")
    for title, batch in (("paper batch sizes", None), ("batch 1", 1)):
        table, red = rows(batch)
        print(f"### Re-ordering alone, AdamW step, {title}\n")
        print("\n".join(table))
        print(f"\nAverage reduction: {sum(red) / len(red):.2%}.\n")


if __name__ == "__main__":
    main()
