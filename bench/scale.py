"""Scale: a deepened LLM step (20k+ ops) through `peakcut profile` and a `peakcut optimize`.

    python -m bench.scale [--workload gpt2-xl] [--layers 96] [--time-budget 60]
                          [--memory-limit 0.4] [--device h100] [--reorder-seconds 20] [--json FILE]

The workload is built at paper size on the meta device with `--layers` decoder layers
(gpt2-xl: peakcut.workloads.base.deepened_gpt2_xl; llama2-7b and btlm-3b: their paper
configs with the depth overridden) and one AdamW step is captured. Each path runs in a
process of its own, as the two commands do, and reports the seconds of each stage and the
peak resident size of that process (getrusage ru_maxrss) after it:

- profile: build, capture, simulate, schedule (time limit --reorder-seconds), fission
  (peakcut.cli.fission_facts): the stages of `peakcut profile`;
- optimize: build, capture, optimize_graph (--memory-limit of the eager peak, --device
  cost model, --time-budget seconds), then what `peakcut optimize` writes: the plan
  (Plan.save: program.py, graph, order, report), the plan's simulated timeline and the
  before/after memory plot, into a temporary directory.

Nothing runs on a device: peaks and latencies are simulated. Prints a markdown table
per path; --json writes every figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from peakcut.workloads.base import Workload, WorkloadInstance, get_workload

WORKLOADS = ("gpt2-xl", "llama2-7b", "btlm-3b")


def _make_btlm(size: str, batch_size: int, n_layer: int) -> tuple[torch.nn.Module, Any]:
    from peakcut.workloads import btlm

    cfg = dataclasses.replace(btlm.CONFIGS[size], n_layer=n_layer)
    input_ids = torch.randint(0, cfg.vocab_size, (batch_size, btlm.SEQ[size]))
    attention_mask = torch.ones(batch_size, btlm.SEQ[size], dtype=torch.long)
    return btlm.BTLMForCausalLM(cfg), (input_ids, attention_mask, input_ids.clone())


def build(name: str, layers: int) -> WorkloadInstance:
    """The paper-size workload `name` with `layers` decoder layers (meta device)."""
    from peakcut.workloads import llm

    make: Callable[..., Any] = {"gpt2-xl": llm.make_gpt2_xl, "llama2-7b": llm.make_llama2_7b,
                                "btlm-3b": _make_btlm}[name]
    base: Workload = get_workload(name)
    deep = dataclasses.replace(base, title=f"{base.title} deepened to {layers} layers",
                               make=functools.partial(make, n_layer=layers))
    return deep.build("paper")


def _peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30   # ru_maxrss: KiB on Linux


class Stages:
    """Seconds and the process's peak RSS after each stage."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = fn()
        self.rows.append({"stage": name, "seconds": round(time.perf_counter() - t0, 2),
                          "peak_rss_gib": round(_peak_rss_gib(), 2)})
        print(f"  {name}: {self.rows[-1]['seconds']} s, peak RSS {self.rows[-1]['peak_rss_gib']} GiB",
              file=sys.stderr, flush=True)
        return out


def part_profile(args: argparse.Namespace) -> dict[str, Any]:
    import peakcut
    from peakcut.cli import fission_facts
    from peakcut.memory import simulate
    from peakcut.schedule import schedule

    st = Stages()
    t0 = time.perf_counter()
    inst = st.run("build", lambda: build(args.workload, args.layers))
    g = st.run("capture", lambda: peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
    prof = st.run("simulate", lambda: simulate(g))
    sched = st.run("schedule", lambda: schedule(g, time_limit=args.reorder_seconds))
    ftree = st.run("fission", lambda: fission_facts(g))
    return {"description": inst.description, "nodes": len(g.nodes), "stages": st.rows,
            "seconds": round(time.perf_counter() - t0, 2), "peak_rss_gib": round(_peak_rss_gib(), 2),
            "eager_peak_bytes": prof.peak_bytes, "reordered_peak_bytes": sched.peak_bytes,
            "reorder_method": sched.method, "reorder_lower_bound_bytes": sched.lower_bound_bytes,
            "fission_root_peak_bytes": ftree["fission_root_peak_bytes"],
            "ftree_nodes_per_level": ftree["ftree_nodes_per_level"]}


def part_optimize(args: argparse.Namespace) -> dict[str, Any]:
    import peakcut
    from peakcut.optimizer import optimize_graph
    from peakcut.optimizer.plan import Plan
    from peakcut.report.plot import plot_before_after
    from peakcut.simulate import simulate_timeline

    st = Stages()
    t0 = time.perf_counter()
    inst = st.run("build", lambda: build(args.workload, args.layers))
    g = st.run("capture", lambda: peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
    found = st.run("optimize_graph", lambda: optimize_graph(
        g, memory_limit=args.memory_limit, time_budget=args.time_budget, device=args.device))

    def write() -> None:
        best = found.best
        with tempfile.TemporaryDirectory() as out:
            plan = Plan(inst.model, best.program, best.order, {**found.report, "title": inst.description})
            plan.save(out)
            after = simulate_timeline(best.program, best.order, found.cost)
            plot_before_after(found.eager, after, Path(out) / "memory.png", inst.description)

    st.run("write plan", write)
    r = found.report
    s = r["search"]
    return {"description": inst.description, "nodes": len(g.nodes), "stages": st.rows,
            "seconds": round(time.perf_counter() - t0, 2), "peak_rss_gib": round(_peak_rss_gib(), 2),
            "program_nodes": len(found.best.program.nodes), "feasible": r["feasible"],
            "eager_peak_bytes": r["eager_peak_bytes"], "peak_bytes": r["peak_bytes"],
            "peak_ratio": r["peak_ratio"], "latency_ratio": r["latency_ratio"],
            "states": s["states"], "states_per_minute": s["states_per_minute"], "stopped": s["stopped"],
            "search_seconds": s["seconds"], "optimize_graph_seconds": s["total_seconds"],
            "applied": len(r["applied"])}


def _child(args: argparse.Namespace, part: str) -> dict[str, Any]:
    """Run one path in a fresh process; its last stdout line is the JSON of its figures."""
    cmd = [sys.executable, "-m", "bench.scale", "--part", part, "--workload", args.workload,
           "--layers", str(args.layers), "--time-budget", str(args.time_budget),
           "--memory-limit", str(args.memory_limit), "--device", args.device,
           "--reorder-seconds", str(args.reorder_seconds)]
    print(f"{part}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
    found = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    found["process_seconds"] = round(time.perf_counter() - t0, 1)   # with the interpreter's start and imports
    return found


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def table(profile: dict[str, Any], optimize: dict[str, Any]) -> str:
    lines = [f"{profile['description']}: {profile['nodes']:,} ops.", ""]
    for title, found in (("profile", profile), ("optimize", optimize)):
        lines += [f"| {title} stage | seconds | peak RSS GiB (process, so far) |", "|---|---|---|"]
        lines += [f"| {r['stage']} | {r['seconds']:.1f} | {r['peak_rss_gib']:.2f} |" for r in found["stages"]]
        lines += [f"| **total** | **{found['seconds']:.1f}** | **{found['peak_rss_gib']:.2f}** |",
                  f"| the process, start to exit | {found['process_seconds']:.1f} | |", ""]
    lines.append(f"profile: eager peak {_gib(profile['eager_peak_bytes'])} GiB, re-ordered "
                 f"{_gib(profile['reordered_peak_bytes'])} GiB ({profile['reorder_method']}), F-Tree root in 2 "
                 f"parts {_gib(profile['fission_root_peak_bytes'] or 0)} GiB (simulated).")
    lines.append(f"optimize: {optimize['states']} states ({optimize['states_per_minute']:.0f}/min, stopped: "
                 f"{optimize['stopped']}), plan peak {_gib(optimize['peak_bytes'])} GiB = "
                 f"{optimize['peak_ratio']:.1%} of eager, latency x{optimize['latency_ratio']:.3f}, limit "
                 f"{'met' if optimize['feasible'] else 'not met'}; plan of {optimize['program_nodes']:,} ops, "
                 f"{optimize['applied']} changes (simulated).")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", choices=WORKLOADS, default="gpt2-xl")
    ap.add_argument("--layers", type=int, default=96)
    ap.add_argument("--time-budget", type=float, default=60.0)
    ap.add_argument("--memory-limit", type=float, default=0.4, help="fraction of the eager peak (default 0.4)")
    ap.add_argument("--device", default="h100", help="cost model (default h100)")
    ap.add_argument("--reorder-seconds", type=float, default=20.0, help="profile's re-ordering limit (default 20)")
    ap.add_argument("--json", default=None, help="write every figure to this file")
    ap.add_argument("--part", choices=("profile", "optimize"), default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.part is not None:      # a child: one path, its figures as the last stdout line
        found = part_profile(args) if args.part == "profile" else part_optimize(args)
        print(json.dumps(found))
        return 0
    profile = _child(args, "profile")
    optimize = _child(args, "optimize")
    env = (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
           f"torch {torch.__version__}")
    print(f"Environment: {env}; command: python -m bench.scale {' '.join(argv or sys.argv[1:])}\n")
    print(table(profile, optimize))
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "args": vars(args), "profile": profile,
                                               "optimize": optimize}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
