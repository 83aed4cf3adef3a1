"""Spine figures for BENCHMARKS.md: eager peaks of the paper-size workloads and the
agreement of simulated vs measured peaks.

    python -m bench.spine > bench/spine.md

Paper size: captured over FakeTensors, peak simulated (capture order, CPU workspace
model) and tracked over FakeTensors while the generated program runs.
Tiny size: generated program run for real on this CPU, peak measured from the
allocator's profiler events; time is the median of 3 runs after a warm-up.
"""

from __future__ import annotations

import platform
import time

import torch

import peakcut
from peakcut.memory import simulate
from peakcut.workloads import WORKLOAD_NAMES, get_workload


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def paper_rows(optimizer: str) -> list[str]:
    rows = ["| workload | ops | params GiB | eager peak GiB (simulated) | fake-tracked GiB | "
            "sim/tracked | capture s |", "|---|---|---|---|---|---|---|"]
    for name in WORKLOAD_NAMES:
        inst = get_workload(name).build("paper")
        t0 = time.perf_counter()
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, optimizer)
        seconds = time.perf_counter() - t0
        sim = simulate(g).peak_bytes
        tracked = peakcut.measure(peakcut.build(g), inst.model, inst.batch).peak_bytes
        rows.append(f"| {inst.description} | {len(g.nodes)} | {_gib(g.param_bytes())} | {_gib(sim)} | "
                    f"{_gib(tracked)} | {sim / tracked:.4f} | {seconds:.1f} |")
    return rows


def tiny_rows() -> list[str]:
    rows = ["| workload | optimizer | simulated bytes | CPU-measured bytes | sim/measured | step ms (measured) |",
            "|---|---|---|---|---|---|"]
    for name in WORKLOAD_NAMES:
        inst = get_workload(name).build("tiny")
        for optimizer in ("sgd", "adamw"):
            g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, optimizer)
            m = peakcut.measure(peakcut.build(g), inst.model, inst.batch, repeats=3)
            sim = simulate(g).peak_bytes
            rows.append(f"| {name} | {optimizer} | {sim:,} | {m.peak_bytes:,} | {sim / m.peak_bytes:.4f} | "
                        f"{m.seconds * 1e3:.1f} |")
    return rows


def main() -> None:
    print(f"Environment: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, peakcut {peakcut.__version__}.\n")
    print("### Paper size, AdamW step (simulated; checked against the fake-tensor tracker)\n")
    print("\n".join(paper_rows("adamw")))
    print("\n### Tiny size on this CPU (measured: torch.profiler allocator events)\n")
    print("\n".join(tiny_rows()))


if __name__ == "__main__":
    main()
