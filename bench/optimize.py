"""peakcut.optimize on the seven paper-size workloads, against MAGIS's reported figures.

    python -m bench.optimize > bench/optimize.md            # 60 s per search, 2 processes
    python -m bench.optimize --budget 10 --workloads bert-base --devices h200   # a quick look
    python -m bench.optimize --workloads unet --devices rtx3090 --workspace none   # tensors only

For every workload (AdamW step, captured over FakeTensors; nothing runs) and every analytic
device profile (RTX 3090, H200), four searches with the time budget each:
- least memory within 10% and within 5% of eager latency (latency_limit 1.10, 1.05):
  the peak as a ratio of eager's;
- least latency within 80% and 40% of eager's peak (memory_limit 0.8, 0.4): the
  latency overhead against eager (or "not met: <best peak ratio>").
Peak and latency are simulated: peakcut's timeline (compute + copy streams) under the
device profile, with this CPU's workspace model (--workspace none: tensors only, no
scratch; a GPU's cuDNN/cuBLAS workspaces are not modelled). The last table gives the search
throughput (states built and simulated per minute, on this machine's cores).
MAGIS (ASPLOS'24, RTX 3090, 20 cores) reports 15-60% of PyTorch's peak at 10% overhead
(<= 40% for GPT-Neo and BTLM), 25-70% at 5%, and <= 5% / <= 15% overhead at 80% / 40%.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor

import torch

import peakcut
from peakcut.memory.workspace import WORKSPACE_MODELS, describe_workspace
from peakcut.optimizer import optimize_graph
from peakcut.workloads import WORKLOAD_NAMES, get_workload

BLOCK_REWRITES = ("checkpoint ", "un-checkpoint ", "split ", "split_conv_cat")   # checkpoint_blocks, its inverse,
# split_batch_norms, split_conv_cat
POLISH_REWRITES = "split_conv_grads"                                # the polish (optimizer/polish.py)
POLISH_ROWS = "parts along the rows"                                # split_rows at the plan's peak
ACTIVATION_REWRITES = "saved activations"                         # recompute_activations (its descriptions end so)
SETTINGS = (("latency", 1.10), ("latency", 1.05), ("memory", 0.8), ("memory", 0.4))
DEVICES = ("rtx3090", "h200")


def run_workload(name: str, devices: tuple[str, ...], budget: float, workspace: str | None = "cpu") -> list[dict]:
    """Every (device, setting) search of one workload, in one process (one capture)."""
    torch.set_num_threads(1)
    inst = get_workload(name).build("paper")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    rows = []
    for device in devices:
        for mode, value in SETTINGS:
            kw = {"latency_limit": value} if mode == "latency" else {"memory_limit": value}
            t0 = time.perf_counter()
            found = optimize_graph(g, time_budget=budget, device=device, workspace=workspace, **kw)
            r = found.report
            rows.append({"workload": name, "description": inst.description, "device": device, "mode": mode,
                         "value": value, "feasible": r["feasible"], "peak_ratio": r["peak_ratio"],
                         "latency_ratio": r["latency_ratio"], "states": r["search"]["states"],
                         "states_per_minute": r["search"]["states_per_minute"],
                         "wall": time.perf_counter() - t0, "applied": len(r["applied"]),
                         "fission": r["fission"], "recipes": len(r["recipes"]),
                         "rewrites": [d for d in (*r["rewrites"], *r["recipes"])     # in the plan, not undone
                                      if d.startswith(BLOCK_REWRITES) or d.endswith(ACTIVATION_REWRITES)]
                         + _polished(r["applied"], r["rewrites"])})
    return rows


def _polished(applied: list[str], rewrites: list[str]) -> list[str]:
    """What the polish after the search split (optimizer/polish.py), as one entry: backwards
    run as two calls, and input-gradient calls split along the rows (in `applied` but not
    among the base's rewrites, where the search's own split_rows sites are)."""
    split = [d for d in applied if d.startswith(POLISH_REWRITES)]
    rows = [d for d in applied if d.endswith(POLISH_ROWS) and d not in rewrites]
    what = [f"{len(split)} convolution backward(s) as two calls"] if split else []
    what += [f"{len(rows)} input-gradient call(s) in parts along the rows"] if rows else []
    return [f"polish: {', '.join(what)}"] if what else []


def _cell(row: dict) -> str:
    if row["mode"] == "latency":
        mark = "" if row["feasible"] else " (limit not met)"
        return f"{row['peak_ratio']:.1%} ({row['latency_ratio'] - 1:+.1%}){mark}"
    if row["feasible"]:
        return f"{row['latency_ratio'] - 1:+.1%} ({row['peak_ratio']:.0%})"
    return f"not met: best {row['peak_ratio']:.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=60.0, help="seconds per search (default 60)")
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOAD_NAMES))
    ap.add_argument("--devices", nargs="*", default=list(DEVICES))
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--workspace", choices=(*WORKSPACE_MODELS, "none"), default="cpu",
                    help="scratch-memory model (default cpu: this CPU's kernels; none: tensors only)")
    args = ap.parse_args()
    workspace = None if args.workspace == "none" else args.workspace
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_workload, w, tuple(args.devices), args.budget, workspace) for w in args.workloads]
        rows = [row for f in futures for row in f.result()]
    print(f"Command: `python -m bench.optimize --budget {args.budget:g} --workspace {args.workspace}` ({args.jobs} "
          f"processes, one thread each). Environment: torch {torch.__version__}, {platform.machine()}, "
          f"{os.cpu_count()} cores, peakcut {peakcut.__version__}. All figures simulated (timeline under the "
          f"analytic device profile, {describe_workspace(workspace)}); {time.perf_counter() - t0:.0f} s in all.\n")
    head = ("| workload | device | peak @ <=10% latency | peak @ <=5% latency | overhead @ 80% memory | "
            "overhead @ 40% memory |")
    print(head)
    print("|---|---|---|---|---|---|")
    for w in args.workloads:
        for device in args.devices:
            cells = [_cell(r) for mode, value in SETTINGS for r in rows
                     if (r["workload"], r["device"], r["mode"], r["value"]) == (w, device, mode, value)]
            desc = next(r["description"] for r in rows if r["workload"] == w)
            print(f"| {desc} | {device} | " + " | ".join(cells) + " |")
    print("\nPeak cells: peak / eager peak (latency overhead). Overhead cells: latency overhead "
          "(peak / eager peak).\n")
    print("| workload | device | setting | states | states/min | fission (F-Tree node: n) | remat+swap | block and cat rewrites |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        fission = ", ".join(f"{f['ftree_node']}: {f['n']}" for f in r["fission"]) or "-"
        print(f"| {r['workload']} | {r['device']} | {r['mode']} {r['value']} | {r['states']} | "
              f"{r['states_per_minute']:.0f} | {fission} | {r['recipes']} | {'; '.join(r['rewrites']) or '-'} |")


if __name__ == "__main__":
    main()
