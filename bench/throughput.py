"""Search throughput on ViT-base (paper size): states built and simulated per minute.

    python -m bench.throughput > bench/throughput.md     # 60 s per search, about 9 minutes
    python -m bench.throughput --budget 20 --jobs 2      # a quick look

MAGIS (ASPLOS'24, Fig. 15) schedules and simulates 924 states per minute optimizing ViT
(batch 64) on 20 cores. Here each of the four optimizer settings of bench.optimize runs for
the budget on 1 process and on 2 (optimizer.parallel; run this alone on the machine, the 2-
process searches use both cores). A state counts once it is built and simulated (hash
duplicates are not counted, as MAGIS's "Filtered" are not); fission states are evaluated
on compact expansions (peakcut.fission.expand, compact=True) and the returned best on the
full one. Figures are measured wall-clock on this machine; the peaks are simulated (RTX 3090
analytic profile).
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

import peakcut
from peakcut.optimizer import optimize_graph
from peakcut.workloads import get_workload

SETTINGS = (("latency", 1.10), ("latency", 1.05), ("memory", 0.8), ("memory", 0.4))
MAGIS_PER_MINUTE = 924


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="seconds per search (default 60)")
    ap.add_argument("--jobs", type=int, nargs="*", default=[1, 2], help="process counts (default 1 2)")
    ap.add_argument("--device", default="rtx3090")
    args = ap.parse_args()
    torch.set_num_threads(1)
    inst = get_workload("vit-base").build("paper")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    rows = []
    t0 = time.perf_counter()
    for mode, value in SETTINGS:
        for jobs in args.jobs:
            kw = {"latency_limit": value} if mode == "latency" else {"memory_limit": value}
            started = time.perf_counter()
            r = optimize_graph(g, time_budget=args.budget, device=args.device, jobs=jobs, **kw).report
            rows.append((mode, value, jobs, r, time.perf_counter() - started))
    print(f"Command: `python -m bench.throughput --budget {args.budget:g}` ({platform.machine()}, "
          f"{os.cpu_count()} cores, torch {torch.__version__}, peakcut {peakcut.__version__}; "
          f"{len(g.nodes)}-node ViT-base step, AdamW; {args.device} profile). Total "
          f"{(time.perf_counter() - t0) / 60:.1f} min.\n")
    print("| setting | processes | states | search s | states/min | vs MAGIS 924/min | wall s | result |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, value, jobs, r, wall in rows:
        s = r["search"]
        setting = f"latency <= {value:.2f}x" if mode == "latency" else f"memory <= {value:.0%}"
        if mode == "latency":
            result = f"peak {r['peak_ratio']:.1%} (+{r['latency_ratio'] - 1:.1%})"
        elif r["feasible"]:
            result = f"+{r['latency_ratio'] - 1:.1%} ({r['peak_ratio']:.0%})"
        else:
            result = f"not met: best {r['peak_ratio']:.0%}"
        print(f"| {setting} | {jobs} | {s['states']} | {s['seconds']:.1f} | {s['states_per_minute']:.0f} | "
              f"{s['states_per_minute'] / MAGIS_PER_MINUTE:.2f}x | {wall:.1f} | {result} |")


if __name__ == "__main__":
    main()
