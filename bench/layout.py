"""Arena layouts and the caching allocator's reserved bytes on the paper-size workloads and the LLMs.

    python -m bench.layout                                   # 9 workloads, H100 profile, 20 s searches
    python -m bench.layout --workloads bert-base --budget 5  # a quick look

For every workload (AdamW step captured over FakeTensors; nothing runs), on the analytic H100
profile with this CPU's workspace model: the eager order (capture order) and the plan of a
`latency_limit=1.10` search of `--budget` seconds are timed on the profile's streams
(peakcut.simulate) and their storages laid out in one arena (peakcut.memory.layout):
- live peak: the step's simulated peak (caller's storages, the step's storages, workspace);
- arena: the arena of the step's own storages, beside the peak of their live bytes (the
  caller's storages and the ops' workspace are outside it): arena / peak is the layout's
  fragmentation; the seconds the layout took (greedy orders for at most 1 s), and for the
  plan the seconds the optimize report's arena entry took (timing the order on its streams,
  the layout within 5% of the budget, the allocator replay; optimizer.arena);
- reserved: max_memory_reserved predicted by the CUDA caching allocator model
  (peakcut.memory.caching_allocator) replaying two steps of the order's allocations, with
  fixed segments (PyTorch's default) and with expandable_segments, as a ratio of the live peak.
Every figure is simulated. Prints a markdown table; --json writes every figure.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Sequence
from typing import Any

import torch

import peakcut
from peakcut.cost.model import get_cost_model
from peakcut.cost.protocol import CostModel
from peakcut.ir.graph import Graph
from peakcut.memory.allocations import predict_reserved
from peakcut.memory.caching_allocator import AllocatorConfig
from peakcut.memory.layout import plan_layout
from peakcut.memory.lifetimes import NodeEvents
from peakcut.memory.workspace import order_workspace, workspace_model
from peakcut.optimizer import optimize_graph
from peakcut.simulate import simulate_timeline
from peakcut.workloads import ALL_WORKLOAD_NAMES, get_workload

GiB = float(1 << 30)
REFERENCES = (
    "| OLLA (published; its ILP layouts, 0 s to minutes) | | | | | 1.000 (0% fragmentation) | | |",
    "| ROAM (published; its layouts, average over its models) | | | | | < 1.01 (under 1%) | | |",
    "| PyTorch's caching allocator (published by ROAM, average) | | | | | | 1.230 (23.0%) | |",
)


def figures(g: Graph, order: Sequence[int], cost: CostModel, workspace: Any) -> dict[str, Any]:
    """Live peak, layout and reserved predictions of one order of `g` (module doc)."""
    t0 = time.perf_counter()
    timed = simulate_timeline(g, order, cost, workspace)
    events = NodeEvents(start=timed.start_index, end=timed.end_index, end_time=timed.end, points=len(timed.bytes))
    t1 = time.perf_counter()
    lay = plan_layout(g, order, events=events, time_limit=1.0)
    t2 = time.perf_counter()
    ws = order_workspace(g, order, workspace)
    fixed = predict_reserved(lay.lifetimes, ws)
    grown = predict_reserved(lay.lifetimes, ws, config=AllocatorConfig(expandable_segments=True))
    return {"ops": len(order), "storages": len(lay.offsets), "live_peak_bytes": timed.peak_bytes,
            "arena_bytes": lay.arena_bytes, "arena_live_peak_bytes": lay.live_peak_bytes,
            "fragmentation": lay.fragmentation, "layout_method": lay.method, "optimal": lay.optimal,
            "timeline_s": round(t1 - t0, 3), "layout_s": round(t2 - t1, 3),
            "reserved_bytes": fixed.peak_reserved, "allocated_bytes": fixed.peak_allocated,
            "reserved_expandable_bytes": grown.peak_reserved}


def run(names: list[str], budget: float) -> list[dict[str, Any]]:
    cost = get_cost_model("h100")
    rows = []
    for name in names:
        torch.manual_seed(0)
        inst = get_workload(name).build("paper")
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        workspace = workspace_model("auto", g.device)
        eager = figures(g, g.order, cost, workspace)
        t0 = time.perf_counter()
        found = optimize_graph(g, latency_limit=1.10, device="h100", time_budget=budget)
        search_s = time.perf_counter() - t0
        best = found.result.best
        plan = figures(best.program, best.order, cost, workspace)
        r = found.report
        plan.update(report_layout_s=r["layout"]["seconds"], report_arena_bytes=r["arena_bytes"],
                    report_reserved_bytes=r["predicted_reserved_bytes"], peak_ratio=r["peak_ratio"],
                    latency_ratio=r["latency_ratio"], search_s=round(search_s, 1))
        rows += [{"workload": name, "order": "eager", **eager}, {"workload": name, "order": "plan <= 1.10", **plan}]
        print(f"# {name}: eager arena/peak {eager['fragmentation']:.4f} ({eager['layout_s']} s), plan "
              f"{plan['fragmentation']:.4f} ({plan['layout_s']} s)", flush=True)
    return rows


def table(rows: list[dict[str, Any]], budget: float) -> str:
    out = ["| workload (ops) | order | live peak GiB | arena GiB / live bytes of its storages GiB | layout s "
           "/ report's arena entry s (share of the budget) | arena / peak | reserved GiB, fixed segments (/ live peak) | reserved GiB, "
           "expandable segments (/ live peak) |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        seconds = f"{r['layout_s']:.2f}"
        if r["order"] != "eager":
            seconds += f" / {r['report_layout_s']:.2f} ({r['report_layout_s'] / budget:.1%})"
        out.append(
            f"| {r['workload']} ({r['ops']:,}) | {r['order']} | {r['live_peak_bytes'] / GiB:.2f} | "
            f"{r['arena_bytes'] / GiB:.3f} / {r['arena_live_peak_bytes'] / GiB:.3f} | {seconds} | "
            f"{r['fragmentation']:.4f} | {r['reserved_bytes'] / GiB:.2f} (x{r['reserved_bytes'] / r['live_peak_bytes']:.3f}) | "
            f"{r['reserved_expandable_bytes'] / GiB:.2f} "
            f"(x{r['reserved_expandable_bytes'] / r['live_peak_bytes']:.3f}) |")
    out += REFERENCES
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per latency <= 1.10 search (default 20)")
    ap.add_argument("--workloads", nargs="*", default=list(ALL_WORKLOAD_NAMES))
    ap.add_argument("--json", help="write every figure to this file")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    rows = run(args.workloads, args.budget)
    print(f"\nSimulated: analytic H100 profile, {args.budget:g} s searches, this CPU's workspace model; "
          f"torch {torch.__version__}, {platform.machine()}, {time.perf_counter() - t0:.0f} s in all.\n")
    print(table(rows, args.budget))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
