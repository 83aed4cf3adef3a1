"""The `peakcut` command: `peakcut workloads`, `peakcut profile WORKLOAD`, `peakcut optimize WORKLOAD`.

WORKLOAD is a built-in workload or a user's own model, MODULE:FACTORY (cli_model.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

from peakcut.cli_model import FACTORY_HELP, grad_norm, load_step
from peakcut.cli_optimize import add_parser as add_optimize_parser
from peakcut.memory.workspace import describe_workspace
from peakcut.units import format_bytes, format_seconds


def cmd_workloads(args: argparse.Namespace, out: Console) -> int:
    from peakcut.workloads import SIZES, list_workloads

    if args.json:
        print(json.dumps([{"name": w.name, "summary": w.summary, **{s: w.facts(s) for s in SIZES}}
                          for w in list_workloads(gnn=True)], indent=2))
        return 0
    table = Table(title="peakcut workloads (MAGIS Table 2, then the full-size LLMs, then the full-graph GNNs)")
    for col in ("name", "model", *(f"{s} size" for s in SIZES)):
        table.add_column(col)
    for w in list_workloads(gnn=True):
        table.add_row(w.name, w.summary, *(", ".join(f"{k} {v}" for k, v in w.facts(s).items()) for s in SIZES))
    out.print(table)
    return 0


def fission_facts(g: Any) -> dict:
    """F-Tree summary of the batch dimension and the simulated peak with its root split in 2
    (in a forest, the root that lowers it most)."""
    from peakcut.fission import best_root_at_two, find_ftree
    from peakcut.fission.loss import detach_loss

    t0 = time.perf_counter()
    g = detach_loss(g)  # exact; lets regions span forward, loss and backward
    tree, dgraph = find_ftree(g, batch_only=True)
    facts: dict[str, Any] = {"ftree_levels": tree.levels(), "ftree_nodes_per_level": tree.nodes_per_level(),
                             "fission_root_peak_bytes": None}
    best = best_root_at_two(g, tree, dgraph)
    if best is not None:
        root, facts["fission_root_peak_bytes"] = best
        facts["fission_root_ops"] = len(tree.nodes[root].nodes)
    facts["fission_seconds"] = round(time.perf_counter() - t0, 3)
    return facts


def profile_facts(name: str, size: str | None, batch: int | None, optimizer: str | None, status: Any,
                  reorder_seconds: float = 20.0, device: str = "h100",
                  max_grad_norm: float | None = None) -> tuple[dict, Any, Any]:
    """Capture and simulate a workload (a name or module:factory, cli_model.load_step); returns
    (facts, graph, memory profile). `device`: the analytic profile the physical floors are
    priced on (optimizer.floors)."""
    import peakcut
    from peakcut.memory import simulate

    t0 = time.perf_counter()
    status(f"building {name}" + (f" ({size})" if size else ""))
    inst = load_step(name, size, optimizer, batch)
    status(f"capturing one {inst.optimizer_name} training step of {inst.description}")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, inst.optimizer, max_grad_norm=max_grad_norm)
    t_capture = time.perf_counter() - t0
    status("simulating memory")
    prof = simulate(g)
    status("re-ordering for minimum peak memory")
    from peakcut.schedule import schedule

    sched = schedule(g, time_limit=reorder_seconds)
    status("building the F-Tree of the batch dimension")
    ftree = fission_facts(g)
    status(f"pricing the physical floors on {device}")
    from peakcut.cost.profiles import get_profile
    from peakcut.optimizer.floors import step_floors

    floors = step_floors(g, get_profile(device)).as_dict()
    facts = {
        "workload": name, "size": inst.size, "description": inst.description, "optimizer": inst.optimizer_name,
        "max_grad_norm": max_grad_norm,
        "batch_size": inst.batch_size, "nodes": len(g.nodes),
        "opaque_nodes": sum(1 for n in g.nodes if g.is_opaque(n)),
        "param_bytes": g.param_bytes(), "caller_held_bytes": prof.baseline_bytes,
        "eager_peak_bytes": prof.peak_bytes,
        "eager_peak_method": f"simulated (capture order, {describe_workspace('auto', g.device)})",
        "reordered_peak_bytes": sched.peak_bytes,
        "reorder_lower_bound_bytes": sched.lower_bound_bytes,
        "reorder_method": sched.method,
        "reorder_seconds": round(sched.seconds, 3),
        **ftree,
        "floors": floors,
        "peak_op": g.nodes[prof.peak_node].name, "peak_phase": g.nodes[prof.peak_node].phase.value,
        "hotspots_by_module": [{"module": m, "bytes": b} for m, b in prof.hotspots_by_module()[:10]],
        "capture_seconds": round(t_capture, 3),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    return facts, g, prof


def cmd_profile(args: argparse.Namespace, out: Console) -> int:
    err = Console(stderr=True)
    with err.status("starting", spinner="dots") as spinner:
        facts, g, prof = profile_facts(args.workload, args.size, args.batch, args.optimizer,
                                       lambda text: spinner.update(text), args.reorder_seconds, args.device,
                                       args.max_grad_norm)
        if args.plot:
            from peakcut.report.plot import plot_timeline

            spinner.update(f"plotting to {args.plot}")
            plot_timeline(g, prof, args.plot, f"{facts['description']} — {facts['optimizer']} step (simulated)")
            facts["plot"] = str(args.plot)
    if args.json:
        print(json.dumps(facts, indent=2))
        return 0
    table = Table(title=f"peakcut profile: {facts['description']}", show_header=False)
    table.add_column("fact")
    table.add_column("value", justify="right")
    table.add_row("ops in the step", f"{facts['nodes']:,} ({facts['opaque_nodes']} opaque)")
    table.add_row("parameter bytes", format_bytes(facts["param_bytes"]))
    table.add_row("caller-held (params, buffers, state, batch)", format_bytes(facts["caller_held_bytes"]))
    table.add_row("eager peak (simulated)", format_bytes(facts["eager_peak_bytes"]))
    saved = 1 - facts["reordered_peak_bytes"] / facts["eager_peak_bytes"]
    table.add_row("re-ordered peak (simulated)",
                  f"{format_bytes(facts['reordered_peak_bytes'])} ({saved:.2%} less)")
    table.add_row("no order can go below", format_bytes(facts["reorder_lower_bound_bytes"]))
    table.add_row("F-Tree (batch dimension)", f"{facts['ftree_levels']} levels, nodes per level "
                  f"{facts['ftree_nodes_per_level']}")
    if facts["fission_root_peak_bytes"] is not None:
        table.add_row("peak with the F-Tree root in 2 parts (simulated)",
                      format_bytes(facts["fission_root_peak_bytes"]))
    table.add_row("peak reached at", f"{facts['peak_op']} ({facts['peak_phase']})")
    floors = facts["floors"]
    table.add_row(f"memory floor on {floors['device']} (largest one-op working set)",
                  f"{format_bytes(floors['memory_bytes'])} ({floors['memory_op']})")
    table.add_row(f"compute floor on {floors['device']} (every op at peak rate)",
                  format_seconds(floors["compute_seconds"]))
    table.add_row("latency floor at the memory floor (state over the host link)",
                  format_seconds(floors["latency_at_memory_floor_seconds"]))
    table.add_row("capture + simulate + re-order + F-Tree", f"{facts['seconds']:.1f} s")
    out.print(table)
    hot = Table(title="largest memory hot-spots at the peak, by producing module")
    hot.add_column("module")
    hot.add_column("bytes live at peak", justify="right")
    for row in facts["hotspots_by_module"]:
        hot.add_row(row["module"], format_bytes(row["bytes"]))
    out.print(hot)
    if args.plot:
        out.print(f"memory timeline written to {args.plot}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from peakcut.cost.profiles import GPU_PROFILES
    from peakcut.workloads import SIZES

    gpu_names = tuple(GPU_PROFILES)
    p = argparse.ArgumentParser(
        prog="peakcut", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fit training steps into less accelerator memory.\n\n" + FACTORY_HELP,
        epilog="peakcut optimize --help and peakcut profile --help give each command's options.")
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("workloads", help="list the benchmark workloads and their sizes")
    w.add_argument("--json", action="store_true", help="print JSON instead of a table")
    w.set_defaults(func=cmd_workloads)
    pr = sub.add_parser("profile", help="capture a training step (a workload or your module:factory) and "
                        "simulate its memory", formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="Capture one training step and simulate its memory.\n\n" + FACTORY_HELP)
    pr.add_argument("workload", help="a workload name (peakcut workloads) or MODULE:FACTORY")
    pr.add_argument("--size", choices=SIZES, default=None, help="built-in workloads: the size (default paper)")
    pr.add_argument("--batch", type=int, default=None,
                    help="built-in workloads: the batch size (default: the size's own)")
    pr.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default=None,
                    help="the optimizer when the factory returns none (default adamw)")
    pr.add_argument("--max-grad-norm", type=grad_norm, default=None, metavar="NORM",
                    help="clip the gradients to this global norm before the update (default: no clip)")
    pr.add_argument("--plot", metavar="FILE.png", default=None, help="write the memory timeline plot")
    pr.add_argument("--json", action="store_true", help="print the facts as one JSON object")
    pr.add_argument("--reorder-seconds", type=float, default=20.0,
                    help="time limit of the re-ordering search (default 20)")
    pr.add_argument("--device", choices=gpu_names, default="h100",
                    help="device profile the physical floors are priced on (default h100)")
    pr.set_defaults(func=cmd_profile)
    add_optimize_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args, Console()))


if __name__ == "__main__":
    sys.exit(main())
