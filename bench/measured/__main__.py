"""python -m bench.measured: the medium table (see bench.measured)."""

from __future__ import annotations

import argparse
import gc
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from bench.measured import cold_warm, report
from bench.measured.configs import (
    COMPILE_BUDGETS,
    PEAKCUT_LIMITS,
    Built,
    build_compiled,
    build_eager,
    build_peakcut,
    peakcut_name,
)
from bench.measured.numbers import compare_steps, guarded_float64_eager
from bench.measured.run import Cell, interleaved, peak_of
from bench.peers.results import fail_reason
from peakcut.runtime import keep_freed_host_memory
from peakcut.workloads import WORKLOAD_NAMES, get_workload

HERE = Path(__file__).parent
RESULTS = HERE / "results.json"
PLOTS = HERE.parent.parent / "docs" / "measured"
"""One Pareto plot per workload (medium-<workload>.png), committed beside the docs."""
WARMUP = 1
"""Steps before a configuration's peak step (the peak step warms it further before the rounds);
compile's first step, the compilation, is made when it is built, and a peakcut plan has run
its 2 steps of the number check."""
BUDGET_PER_EAGER_SECOND = 50.0     # peakcut's time budget, in eager steps: capture, calibration, search, verification
BUDGET_RANGE = (85.0, 160.0)
"""With these, the seven workloads took 44.1 minutes here on a noisy night (2026-11-27; issue 16: under 45)."""


def available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 8 << 30


def measure_workload(name: str, rounds: int, budget_factor: float = BUDGET_PER_EAGER_SECOND) -> list[Cell]:
    inst = get_workload(name).build("medium")
    torch._dynamo.reset()
    eager = build_eager(inst)
    for _ in range(WARMUP):
        eager.step()
    eager_cell = Cell(name, "eager")
    eager_cell.peak_bytes, _, eager_cell.held_bytes = peak_of(eager, inst.batch)
    eager_s = min(_timed(eager.step) for _ in range(2))    # the budget's unit: the steadier of two
    budget = min(BUDGET_RANGE[1], max(BUDGET_RANGE[0], budget_factor * eager_s))
    per_group = configurations_per_group(eager_cell.held_bytes, eager_cell.peak_bytes, available_bytes())
    builders: list[tuple[str, Callable[[], Built]]] = [
        *((peakcut_name(k, v), lambda k=k, v=v: build_peakcut(inst, k, v, budget)) for k, v in PEAKCUT_LIMITS),
        ("checkpoint per block", lambda: build_eager(inst, "checkpoint per block")),
        *((f"compile {b}", lambda b=b: build_compiled(inst, b)) for b in COMPILE_BUDGETS),
    ]
    print(f"{name}: eager step {eager_s:.2f} s, peak {eager_cell.peak_bytes / 2**30:.2f} GiB; peakcut budget "
          f"{budget:.0f} s; {per_group} configurations per group of rounds", flush=True)
    cells: list[Cell] = []
    for start in range(0, len(builders), per_group):
        group: list[tuple[Built, Cell]] = []
        for label, build in builders[start:start + per_group]:
            try:
                built = build()
                cell = Cell(name, built.name, setup_seconds=built.setup_seconds, budget_seconds=built.budget_seconds,
                            note=built.note)
                if built.plan is not None:
                    ref = build_eager(inst)
                    cell.numbers = compare_steps(inst.model, ref, built,
                                                  referee=lambda: guarded_float64_eager(
                                                      inst, eager_cell.peak_bytes, available_bytes))
                    del ref
                    cell.predicted = report.predicted(built.report)
                else:                               # (a plan is warm from the number check)
                    for _ in range(WARMUP):
                        built.step()
                cell.peak_bytes, cell.host_bytes, cell.held_bytes = peak_of(built, inst.batch)
                group.append((built, cell))
            except Exception as e:  # noqa: BLE001 - a failing configuration is a table cell, not a crash
                cells.append(Cell(name, label, error=fail_reason(e)))
            gc.collect()
        eager_times, times = interleaved(eager.step, [b.step for b, _ in group], rounds)
        eager_cell.times += eager_times
        eager_cell.eager_times += eager_times
        for (_, cell), t in zip(group, times, strict=True):
            cell.times, cell.eager_times = t, eager_times
            cells.append(cell)
            print(f"  {cell.name}: x{cell.ratio:.3f} eager (noise {cell.noise:.3f}), peak "
                  f"{cell.peak_bytes / 2**30:.2f} GiB{' ' + cell.note if cell.note else ''}", flush=True)
        del group
        gc.collect()
    torch._dynamo.reset()
    return [eager_cell, *cells]


def configurations_per_group(held: int, peak: int, available: int) -> int:
    """How many configurations run in one group of rounds besides eager: each keeps its own
    model and AdamW state (`held`) between steps; the memory a step makes and frees again
    (peak - held) is counted twice (malloc keeps what is freed, and fragments), and half of
    what is available is used."""
    transient = max(0, peak - held)
    return max(1, int((0.5 * available - 2 * transient) / max(held, 1)) - 1)


def _timed(step: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.measured", description=__doc__)
    p.add_argument("--workloads", default=",".join(WORKLOAD_NAMES))
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds (>= 7)")
    p.add_argument("--no-write", action="store_true", help="print only; leave results.json and BENCHMARKS.md")
    p.add_argument("--report-only", action="store_true",
                   help="measure nothing: the table (BENCHMARKS.md) and the plots again from results.json")
    p.add_argument("--cold-warm", action="store_true",
                   help="peakcut.optimize from an empty cost cache, then a warm one (latency 1.10, 90 s): "
                        "bench/measured/cold_cache_run.md (bench.measured.cold_warm)")
    p.add_argument("--budget-factor", type=float, default=BUDGET_PER_EAGER_SECOND,
                   help=f"peakcut's time budget in eager steps (clamped to {BUDGET_RANGE[0]:g}-{BUDGET_RANGE[1]:g} s)")
    args = p.parse_args(argv)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if args.cold_warm:
        print(cold_warm.main(names, write=not args.no_write))
        return
    if args.report_only:
        report_from_results()
        return
    if len(names) > 1 and not args.no_write:
        each_in_its_own_process(names, args.rounds, args.budget_factor)
        return
    kept = keep_freed_host_memory()   # as peakcut.optimize does; every configuration runs under it
    env = (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
           f"{torch.__version__}; glibc malloc keeps freed memory: {kept}; {args.rounds} rounds")
    runs: list[dict[str, Any]] = []
    for name in names:     # one run per workload, saved as soon as it is measured
        t0 = time.perf_counter()
        cells = measure_workload(name, args.rounds, args.budget_factor)
        run = {"env": env, "seconds": round(time.perf_counter() - t0, 1), "workloads": [name],
               "cells": [asdict(c) for c in cells]}
        runs = [run] if args.no_write else save(run)
    text = report.markdown(runs)
    if not args.no_write:
        report.write_benchmarks(text)
        report.plots(runs, PLOTS)
    print(text)


def report_from_results() -> None:
    """The table in BENCHMARKS.md and the plots, from every run saved in results.json."""
    runs = json.loads(RESULTS.read_text())["runs"] if RESULTS.exists() else []
    text = report.markdown(runs)
    report.write_benchmarks(text)
    report.plots(runs, PLOTS)
    print(text)


def each_in_its_own_process(names: list[str], rounds: int, budget_factor: float) -> None:
    """Every workload measured by a process of its own (each saves its cells as it ends), then
    the table and plots from results.json. In one process the freed memory of the workloads
    before (kept by malloc, as peakcut.optimize keeps it) added up: BTLM-3B, the last, was
    killed for memory at 24 GB on a 24 GB machine."""
    failed = []
    for name in names:
        done = subprocess.run([sys.executable, "-m", "bench.measured", "--workloads", name, "--rounds", str(rounds),
                               "--budget-factor", str(budget_factor)], check=False)
        if done.returncode != 0:
            failed.append(f"{name} (exit {done.returncode})")
    report_from_results()
    if failed:
        print(f"not measured: {', '.join(failed)}", file=sys.stderr)


def save(run: dict[str, Any]) -> list[dict[str, Any]]:
    """results.json with `run` replacing the cells of its workloads; every run kept there."""
    runs = []
    for old in json.loads(RESULTS.read_text())["runs"] if RESULTS.exists() else []:
        old["workloads"] = [w for w in old["workloads"] if w not in run["workloads"]]
        old["cells"] = [c for c in old["cells"] if c["workload"] not in run["workloads"]]
        if old["workloads"]:
            runs.append(old)
    runs.append(run)
    RESULTS.write_text(json.dumps({"runs": runs}, indent=1))
    return runs

if __name__ == "__main__":
    main()
