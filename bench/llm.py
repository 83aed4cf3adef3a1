"""The LLMs at paper size under absolute memory limits (issue 17), against the physical floors.

    python -m bench.llm                                       # both models, 80/40/24 GB, H100 and H200
    python -m bench.llm --workloads llama2-7b --devices h100 --limits 80GB --budget 120

For each workload (AdamW step captured over FakeTensors; nothing runs), device profile and
memory limit: `optimize_graph(g, memory_limit=<limit>, device=<profile>, time_budget=<budget>)`
and the step's floors (peakcut.optimizer.floors): the plan's simulated peak and step time, its
overhead over the compute floor, the ZeRO-Offload-style peer on the same yardstick
(peakcut.optimizer.baselines), whether the limit was met (else the best peak found), the
states the search built and its states per minute on this machine. Peaks and latencies are
simulated: peakcut's timeline under the analytic device profile, with the CPU workspace
model. Prints a markdown table; --json writes every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch

import peakcut
from peakcut.optimizer import optimize_graph
from peakcut.units import format_bytes, format_seconds
from peakcut.workloads import LLM_WORKLOAD_NAMES, get_workload

LIMITS = ("80GB", "40GB", "24GB")
REWRITE_WORDS = (("checkpoint_blocks", "checkpoint "), ("uncheckpoint_blocks", "un-checkpoint "), ("taso", "taso: "))
DEVICES = ("h100", "h200")


def run(names: list[str], devices: list[str], limits: list[str], budget: float) -> list[dict]:
    rows = []
    for name in names:
        t0 = time.perf_counter()
        inst = get_workload(name).build("paper")
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        capture_s = time.perf_counter() - t0
        for device in devices:
            for limit in limits:
                t1 = time.perf_counter()
                found = optimize_graph(g, memory_limit=limit, device=device, time_budget=budget)
                r = found.report
                kinds = {f"fission n={n}": 1 for n in sorted({f["n"] for f in r["fission"]})}
                for recipe in found.result.best.recipes:
                    kinds[recipe.kind] = kinds.get(recipe.kind, 0) + 1
                for what in found.result.best.applied:     # rewrites of the step: by their words
                    for kind, prefix in REWRITE_WORDS:
                        if what.startswith(prefix):
                            kinds[kind] = kinds.get(kind, 0) + 1
                rows.append({
                    "workload": name, "description": inst.description, "nodes": len(g.nodes),
                    "capture_s": round(capture_s, 1), "device": device, "limit": limit,
                    "limit_bytes": r["limit"], "feasible": r["feasible"], "peak_bytes": r["peak_bytes"],
                    "eager_peak_bytes": r["eager_peak_bytes"], "latency_s": r["latency_s"],
                    "eager_latency_s": r["eager_latency_s"], "floors": r["floors"], "zero_offload": r["zero_offload"],
                    "overhead_vs_compute_floor": r["overhead_vs_compute_floor"],
                    "states": r["search"]["states"], "states_per_minute": r["search"]["states_per_minute"],
                    "wall_s": round(time.perf_counter() - t1, 1), "applied": kinds,
                })
                print(f"# {name} {device} {limit}: {'met' if r['feasible'] else 'NOT met'}, "
                      f"peak {format_bytes(r['peak_bytes'])}, {format_seconds(r['latency_s'])}", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| workload | device | limit | plan peak | met | step time | over compute floor | ZeRO-Offload-style "
           "peak / time (fits?) | memory floor | compute floor | eager peak / time | states (per min) | "
           "moves applied |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f, z = r["floors"], r["zero_offload"]
        moves = ", ".join(f"{k} {v}" for k, v in sorted(r["applied"].items()))
        fits = "yes" if z["peak_bytes"] <= r["limit_bytes"] else "no"
        out.append(
            f"| {r['workload']} ({r['nodes']:,} ops) | {r['device']} | {r['limit']} | {format_bytes(r['peak_bytes'])} | "
            f"{'yes' if r['feasible'] else 'no'} | {format_seconds(r['latency_s'])} | "
            f"{r['overhead_vs_compute_floor']:+.0%} | {format_bytes(z['peak_bytes'])} / "
            f"{format_seconds(z['latency_s'])} ({fits}) | {format_bytes(f['memory_bytes'])} | "
            f"{format_seconds(f['compute_seconds'])} | {format_bytes(r['eager_peak_bytes'])} / "
            f"{format_seconds(r['eager_latency_s'])} | {r['states']} ({r['states_per_minute']:.0f}) | {moves} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="*", default=list(LLM_WORKLOAD_NAMES))
    ap.add_argument("--devices", nargs="*", default=list(DEVICES))
    ap.add_argument("--limits", nargs="*", default=list(LIMITS))
    ap.add_argument("--budget", type=float, default=300.0, help="time budget of each search (s)")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    args = ap.parse_args()
    rows = run(args.workloads, args.devices, args.limits, args.budget)
    print(f"\nbench.llm on {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; budget {args.budget:.0f} s a search; peaks and times simulated\n")
    print(table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)


if __name__ == "__main__":
    main()
