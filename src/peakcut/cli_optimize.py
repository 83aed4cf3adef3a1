"""`peakcut optimize`: search a workload's step under a limit; write program, report, plots.

    peakcut optimize bert-base --size paper --memory-limit 40% --time-budget 60 --device h200
    peakcut optimize my_model:make --latency-limit 1.1 --max-grad-norm 1.0 --out out/mine

A `module:factory` workload is the user's own model (cli_model.FACTORY_HELP: found from the
current directory; the factory returns model, batch, loss_fn and optionally the optimizer;
else --optimizer picks it). Writes into --out: program.py, report.json, graph.json and
order.json (a saved plan, see peakcut.load_plan), memory.png (the simulated memory of eager
and the plan over time) and, with --pareto, pareto.png.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from peakcut.cli_model import FACTORY_HELP, grad_norm, load_step
from peakcut.units import format_bytes, format_seconds


def cmd_optimize(args: argparse.Namespace, out: Console) -> int:
    import peakcut
    from peakcut.optimizer import optimize_graph
    from peakcut.optimizer.phases import merged, phases_line
    from peakcut.optimizer.plan import Plan, plan_contents
    from peakcut.report.plot import plot_before_after, plot_front
    from peakcut.simulate import simulate_timeline

    err = Console(stderr=True)
    target = Path(args.out or f"out/optimize/{args.workload.replace(':', '_').replace('/', '_')}")
    with err.status("capturing", spinner="dots") as spinner:
        source = load_step(args.workload, args.size, args.optimizer)
        model, description = source.model, source.description
        t0 = time.perf_counter()
        g = peakcut.capture(model, source.batch, source.loss_fn, source.optimizer, max_grad_norm=args.max_grad_norm)
        captured_s = time.perf_counter() - t0

        def progress(p: Any) -> None:
            spinner.update(f"searching: {p.states} states, best peak {format_bytes(p.best_peak_bytes)}, "
                           f"latency {format_seconds(p.best_latency_s)}, "
                           f"{'meets' if p.feasible else 'misses'} the limit, "
                           f"{p.elapsed_s:.0f}/{args.time_budget:.0f} s")

        found = optimize_graph(g, memory_limit=args.memory_limit, latency_limit=args.latency_limit,
                               time_budget=args.time_budget, device=args.device, seed=args.seed,
                               pareto=args.pareto, progress=progress, jobs=args.jobs)
        spinner.update(f"writing {target}")
        report = {"workload": args.workload, "description": description, "optimizer": source.optimizer_name,
                  "max_grad_norm": args.max_grad_norm, **found.report}
        report["phases"] = merged(report.get("phases"), {"capture": captured_s}, {}, args.time_budget,
                                  time.perf_counter() - t0)
        best = found.best
        plan = Plan(model, best.program, best.order, {**report, "title": f"peakcut plan: {description}"})
        plan.save(target)
        after = simulate_timeline(best.program, best.order, found.cost)
        report["plots"] = [str(plot_before_after(found.eager, after, target / "memory.png",
                                                 f"{description}: eager vs peakcut plan (simulated)"))]
        if args.pareto:
            points = [(s.peak_bytes / found.eager.peak_bytes, s.latency_s / found.eager.latency_seconds)
                      for s in found.result.front]
            report["plots"].append(str(plot_front(points, target / "pareto.png", f"{description}: front")))
        (target / "report.json").write_text(json.dumps(report, indent=2, default=str))
    table = Table(title=f"peakcut optimize: {description} ({report['device']})")
    table.add_column("")
    table.add_column("eager", justify="right")
    table.add_column("peakcut", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("peak memory", format_bytes(report["eager_peak_bytes"]), format_bytes(report["peak_bytes"]),
                  f"{report['peak_ratio']:.1%}")
    table.add_row("latency", format_seconds(report["eager_latency_s"]), format_seconds(report["latency_s"]),
                  f"{report['latency_ratio']:.1%}")
    out.print(table)
    out.print(f"memory: {report['memory_method']}\nlatency: {report['latency_method']}")
    floors = report.get("floors")
    if floors:
        out.print(f"floors on {floors['device']}: memory {format_bytes(floors['memory_bytes'])} (largest one-op "
                  f"working set), compute {format_seconds(floors['compute_seconds'])}; this plan's latency is "
                  f"{report['overhead_vs_compute_floor']:+.0%} over the compute floor")
    zero = report.get("zero_offload")
    if zero:
        out.print(f"ZeRO-Offload-style peer ({zero['description']}; {zero['method']}): peak "
                  f"{format_bytes(zero['peak_bytes'])}, latency {format_seconds(zero['latency_s'])}")
    s = report["search"]
    out.print(f"search: {s['states']} states in {s['seconds']:.1f} s ({s['states_per_minute']:.0f}/min), "
              f"stopped: {s['stopped']}; limit {'met' if report['feasible'] else 'NOT met'}")
    out.print(f"time: {phases_line(report['phases'])}")
    standing = report.get("peak_standing")
    if standing:
        out.print(standing["text"])
    contents = plan_contents(report)
    out.print(f"the plan ({len(contents)} changes; the search's path to it: report.json's \"applied\"):")
    for line in contents[:20]:
        out.print(f"  - {line}")
    if len(contents) > 20:
        out.print(f"  ... and {len(contents) - 20} more (report.json: rewrites, fission, recipes)")
    out.print(f"wrote {target}/program.py, report.json, " + ", ".join(Path(p).name for p in report["plots"]))
    return 0 if report["feasible"] or args.pareto else 3


def add_parser(sub: Any) -> None:
    from peakcut.cost.model import KNOWN_SPECS
    from peakcut.workloads import SIZES

    o = sub.add_parser("optimize", help="search a training step (a workload or your module:factory) under a "
                       "memory or latency limit", formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Search one training step's rewrites under a memory or latency limit and\n"
                       "write the plan (program.py, report.json, plots) into --out, e.g.\n"
                       "  peakcut optimize my_model:make --memory-limit 50% --max-grad-norm 1.0\n\n"
                       + FACTORY_HELP)
    o.add_argument("workload", help="a workload name (peakcut workloads) or MODULE:FACTORY")
    limit = o.add_mutually_exclusive_group()
    limit.add_argument("--memory-limit", default=None, help="e.g. 40%%, 0.4, 12GB: least latency under it")
    limit.add_argument("--latency-limit", default=None, help="ratio to eager, e.g. 1.1: least memory under it")
    o.add_argument("--time-budget", type=float, default=60.0, help="seconds for the whole search (default 60)")
    o.add_argument("--device", default="h200", help=f"cost model: {', '.join(KNOWN_SPECS)}")
    o.add_argument("--size", choices=SIZES, default=None, help="built-in workloads: the size (default paper)")
    o.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default=None,
                   help="the optimizer when the factory returns none (default adamw)")
    o.add_argument("--max-grad-norm", type=grad_norm, default=None, metavar="NORM",
                   help="clip the gradients to this global norm before the update (default: no clip)")
    o.add_argument("--pareto", action="store_true", help="collect the memory/latency front")
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--jobs", type=int, default=1,
                   help="processes to search on (forked; not with --device measured; default 1)")
    o.add_argument("--out", default=None, help="output directory (default out/optimize/WORKLOAD)")
    o.set_defaults(func=cmd_optimize)
