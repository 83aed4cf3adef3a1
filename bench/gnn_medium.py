"""Vertex-range fission at medium size, measured on this CPU: eager's numbers and the peak.

    python -m bench.gnn_medium [--models reddit-gcn reddit-sage reddit-gin reddit-gat] [--parts 2 64]

For each GNN workload at medium size (20,000 vertices, 400,000 edges; docs/gnn.md): capture
the step with Adam, split every sum over edges in n edge ranges (transform.vertex_ranges,
the body of the split_vertex_ranges rule), run the generated program next to the user's
eager loop for 3 steps (loss, gradients, parameters, optimizer state; tolerance from float32
and the longest reduction, the edges), and compare the peak measured by torch.profiler's
CPU allocator events with the simulated one (peakcut.memory.simulate). Writes
bench/gnn_medium.json and prints a table.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.memory import simulate
from peakcut.runtime.equivalence import rounding_tolerance
from peakcut.transform.vertex_ranges import find_edge_chains, split_edge_chains
from peakcut.workloads import get_workload

MODELS = ("reddit-gcn", "reddit-sage", "reddit-gin", "reddit-gat")
STEPS = 3
OUT = Path(__file__).with_suffix(".json")


def row(name: str, n: int) -> dict[str, Any]:
    """One workload split in n parts: numbers against eager, simulated and measured peaks."""
    inst = get_workload(name).build("medium")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, peakcut.Adam(lr=1e-2), keep_grads=True)
    edges = int(inst.batch[1].numel())
    r, reasons = split_edge_chains(g, g.order, find_edge_chains(g), n)
    if r is None:
        return {"workload": name, "parts": n, "split": 0, "why_not": [str(x) for x in reasons if x]}
    tol = rounding_tolerance(torch.float32, edges, STEPS)
    t0 = time.perf_counter()
    report = peakcut.check_equivalence(copy.deepcopy(inst.model), inst.batch, inst.loss_fn, peakcut.Adam(lr=1e-2),
                                       lambda _m: Step(r.graph, r.order), steps=STEPS, rtol=tol, atol=tol)
    checked_s = time.perf_counter() - t0
    simulated = simulate(r.graph, r.order).peak_bytes
    measured = peakcut.measure(Step(r.graph, r.order), copy.deepcopy(inst.model), inst.batch,
                               method="cpu-profiler", repeats=1).peak_bytes
    eager_simulated = simulate(g, g.order).peak_bytes
    return {"workload": name, "parts": n, "split": reasons.count(None), "numbers_ok": report.ok,
            "largest_difference": max((d.max_abs for d in report.differences), default=0.0),
            "tolerance": tol, "simulated_peak": simulated, "measured_peak": measured,
            "measured_over_simulated": measured / simulated, "captured_simulated_peak": eager_simulated,
            "check_seconds": round(checked_s, 1)}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--parts", nargs="+", type=int, default=[2, 64])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows = [row(name, n) for name in args.models for n in args.parts]
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    mib = 2**20
    print("| workload | parts | sums split | eager's numbers | simulated peak | measured peak | measured / simulated "
          "| captured step, simulated |")
    print("|---|---|---|---|---|---|---|---|")
    for x in rows:
        if not x["split"]:
            print(f"| {x['workload']} | {x['parts']} | 0 | | | | | {'; '.join(x['why_not'])} |")
            continue
        print(f"| {x['workload']} | {x['parts']} | {x['split']} | {'yes' if x['numbers_ok'] else 'NO'} | "
              f"{x['simulated_peak'] / mib:.1f} MiB | {x['measured_peak'] / mib:.1f} MiB | "
              f"{x['measured_over_simulated']:.3f} | {x['captured_simulated_peak'] / mib:.1f} MiB |")
    return rows


if __name__ == "__main__":
    main()
