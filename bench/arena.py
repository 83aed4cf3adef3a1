"""Plans run with and without their arena on this CPU: measured peak against held + arena + unplanned, and step time.

    python -m bench.arena                                     # the seven workloads, medium size
    python -m bench.arena --workloads bert-base --budget 10   # a quick look

For every workload (AdamW, `latency_limit=1.10` searched for `--budget` seconds on the
analytic CPU profile), the plan's program is built twice, without and with its arena
(peakcut.codegen.arena_plan), and both run from the same weights:
- numbers: the parameters and losses after `--steps` steps, bit for bit or the largest
  difference;
- measured peak (allocator events, runtime.measure's cpu-profiler method) of one step after
  the first, the caller's inputs and the arena (made before the step) included, beside the
  plan's `needed_bytes` (held + arena + the unplanned remainder's simulated peak) and the
  simulated live peak of the plan without the arena;
- step time: the median of `--steps` steps each, the two programs alternating (measured, this
  CPU, wall clock).
The arena's own figures (arena bytes, unplanned remainder by why) come from its plan. The
machine may be shared: times are only as quiet as it is. Prints a markdown table; --json
writes every figure.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
from typing import Any

import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.memory import simulate
from peakcut.optimizer import optimize_graph
from peakcut.runtime.measure import bound_peak, held_input_bytes
from peakcut.workloads import WORKLOAD_NAMES, get_workload

MiB = float(1 << 20)


def _timed(step: Step, model: torch.nn.Module, batch: Any) -> float:
    t0 = time.perf_counter()
    step(model, batch)
    return time.perf_counter() - t0


def _peak(step: Step, model: torch.nn.Module, batch: Any) -> int:
    inputs = step.bind(model, batch)
    return bound_peak(step, inputs, step.device_of(inputs), held_input_bytes(step, inputs))


def run_one(name: str, size: str, budget: float, steps: int) -> dict[str, Any]:
    """The figures of one workload (module doc)."""
    inst = get_workload(name).build(size)
    t0 = time.perf_counter()
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    found = optimize_graph(g, latency_limit=1.10, device="cpu", time_budget=budget)
    best = found.best
    searched_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    placed = Step(best.program, list(best.order), arena=True)
    built_s = time.perf_counter() - t1
    plain = Step(best.program, list(best.order))
    models = {"plain": copy.deepcopy(inst.model), "arena": copy.deepcopy(inst.model)}
    steps_of = {"plain": plain, "arena": placed}
    times: dict[str, list[float]] = {"plain": [], "arena": []}
    losses: dict[str, list[float]] = {"plain": [], "arena": []}
    for k in range(steps + 1):                  # the first of each warms up (state, arena)
        for key in ("plain", "arena") if k % 2 == 0 else ("arena", "plain"):
            t = time.perf_counter()
            loss = steps_of[key](models[key], inst.batch)
            times[key].append(time.perf_counter() - t)
            losses[key].append(float(loss))
    diffs = [float((p - q).detach().abs().max()) for p, q in zip(models["plain"].parameters(), models["arena"].parameters(),
                                                      strict=True)]
    identical = losses["plain"] == losses["arena"] and max(diffs, default=0.0) == 0.0
    peaks = {key: _peak(steps_of[key], models[key], inst.batch) for key in ("plain", "arena")}
    ap = placed.arena_plan
    if ap is None:
        raise RuntimeError("a Step built with arena=True has no arena plan")
    return {"workload": name, "size": size, "searched_s": round(searched_s, 1), "arena_build_s": round(built_s, 2),
            "recipes": len(found.report.get("recipes", [])), "fission": len(found.report.get("fission", [])),
            "simulated_peak_bytes": simulate(best.program, plain.order).peak_bytes,
            "measured_plain_bytes": peaks["plain"], "measured_arena_bytes": peaks["arena"],
            "needed_bytes": ap.needed_bytes, "arena": ap.as_dict(listed=10),
            "measured_over_needed": peaks["arena"] / ap.needed_bytes,
            "identical": identical, "max_param_diff": max(diffs, default=0.0),
            "plain_s": statistics.median(times["plain"][1:]), "arena_s": statistics.median(times["arena"][1:]),
            "times": times}


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| workload | simulated live peak (MiB) | measured, no arena | held + arena + unplanned | "
            "measured, arena | measured / needed | arena (MiB) | unplanned peak (MiB) | numbers | "
            "step s, no arena | step s, arena |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        numbers = "identical" if r["identical"] else f"max diff {r['max_param_diff']:.2g}"
        lines.append(f"| {r['workload']} | {r['simulated_peak_bytes'] / MiB:.1f} | {r['measured_plain_bytes'] / MiB:.1f} "
                     f"| {r['needed_bytes'] / MiB:.1f} | {r['measured_arena_bytes'] / MiB:.1f} "
                     f"| {r['measured_over_needed']:.4f} | {r['arena']['arena_bytes'] / MiB:.1f} "
                     f"| {r['arena']['unplanned_peak_bytes'] / MiB:.1f} "
                     f"| {numbers} "
                     f"| {r['plain_s']:.3f} | {r['arena_s']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOAD_NAMES))
    parser.add_argument("--size", default="medium", choices=("medium", "tiny"))
    parser.add_argument("--budget", type=float, default=30.0, help="search seconds per workload")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per program")
    parser.add_argument("--json", help="write every figure here")
    args = parser.parse_args(argv)
    rows = []
    for name in args.workloads:
        rows.append(run_one(name, args.size, args.budget, args.steps))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(f"\nMeasured on {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads ({args.size} size; a shared machine's times are as quiet as it was):\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
