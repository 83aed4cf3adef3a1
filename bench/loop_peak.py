"""Measured peak of the generated step: baked-constant update (old) vs the user's torch.optim (new).

Issue 14, Done-when: "The plan's measured peak (CPU allocator events) with the user's
optimizer and schedule is no higher than with today's baked constants (report both)."

Run once per version, then compare:

    git worktree add /tmp/peakcut_old 0aaa1dd
    PEAKCUT_CACHE=$(mktemp -d) PYTHONPATH=/tmp/peakcut_old/src \\
        .venv/bin/python bench/loop_peak.py --label old --json /tmp/old.json
    PEAKCUT_CACHE=$(mktemp -d) .venv/bin/python bench/loop_peak.py --label new --json /tmp/new.json
    .venv/bin/python bench/loop_peak.py --compare /tmp/old.json /tmp/new.json
    git worktree remove /tmp/peakcut_old --force

For every tiny workload (bert-base, gpt-neo-1.3b, vit-base, resnet50 by default), AdamW
(lr 1e-3, weight decay 0.01):
- "adamw": capture(model, batch, loss_fn, "adamw") -> build -> measure (both versions; the
  old one bakes the hyper-parameters into the program and keeps its own state);
- "user" (new version only, detected by build()'s `optimizer=` keyword): a torch.optim.AdamW
  over two param groups (weight decay 0.01 on matrices, 0.0 on biases / norms, as
  usual) with a LambdaLR warm-up schedule; two real steps with scheduler.step() are run
  first so the program reads a scheduled lr, then measured;
- "plan": peakcut.optimize(..., "adamw", latency_limit=1.1, time_budget=20, max_states=16,
  device="h200") -> plan.program measured (both versions; LimitNotMet -> e.plan);
- "plan_user" (new version only): the same search with optimizer=<the user's AdamW>.

Peaks are measured: peakcut.measure(method="cpu-profiler"): the c10 CPU allocator's
alloc/free events recorded by torch.profiler (profile_memory=True) during one step after a
warm-up and `repeats` timed runs, summed in order; the peak of that running sum plus the
bytes of the step's inputs (parameters, buffers, optimizer state, batch: held by the caller)
is the peak. The simulated peak (graph.simulate, cpu workspace model), the node at the
simulated peak, and the simulated peak of the optimizer phase alone are recorded beside it
to say where a difference comes from.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

import peakcut
from peakcut.memory import simulate
from peakcut.workloads import get_workload

WORKLOADS = ("bert-base", "gpt-neo-1.3b", "vit-base", "resnet50")
LR, WEIGHT_DECAY = 1e-3, 0.01
WARMUP = 10


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_info() -> dict[str, Any]:
    """Which peakcut source was imported, at which commit, and whether src/ had local edits."""
    src = Path(peakcut.__file__).resolve().parent
    info: dict[str, Any] = {"peakcut_file": str(Path(peakcut.__file__).resolve())}
    try:
        info["commit"] = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."],
                               capture_output=True, text=True, check=True).stdout.splitlines()
        info["src_local_changes"] = [line.strip() for line in dirty]
    except (OSError, subprocess.CalledProcessError):
        info["commit"] = "unknown"
    return info


def user_optimizer_api() -> bool:
    """The new version: build() takes the user's torch.optim optimizer."""
    return "optimizer" in inspect.signature(peakcut.build).parameters


def user_optimizer(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, Any]:
    """torch.optim.AdamW in two param groups (decay / no decay) and a LambdaLR warm-up."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
    return opt, sched


def describe_node(g: Any, nid: int) -> str:
    n = g.nodes[nid]
    phase = getattr(n.phase, "value", n.phase)
    return f"#{nid} {n.op} ({phase}{', ' + n.module if n.module else ''})"


def simulated(g: Any, order: list[int] | None = None) -> dict[str, Any]:
    """Simulated peak, the node there, and the simulated peak over the optimizer phase."""
    prof = simulate(g, order)
    opt_max, opt_node = 0, None
    for i, nid in enumerate(prof.order):
        if getattr(g.nodes[nid].phase, "value", None) == "optimizer" and int(prof.timeline[i]) > opt_max:
            opt_max, opt_node = int(prof.timeline[i]), nid
    return {
        "sim_peak_bytes": int(prof.peak_bytes),
        "sim_peak_node": describe_node(g, prof.peak_node),
        "sim_baseline_bytes": int(prof.baseline_bytes),
        "sim_optimizer_peak_bytes": opt_max,
        "sim_optimizer_peak_node": describe_node(g, opt_node) if opt_node is not None else None,
        "nodes": len(prof.order),
        "optimizer_nodes": sum(1 for nid in prof.order
                               if getattr(g.nodes[nid].phase, "value", None) == "optimizer"),
    }


def state_outside_inputs(step: Any, model: torch.nn.Module, batch: Any) -> tuple[int, int]:
    """(count, bytes) of tensors in the step's torch.optim optimizer.state that are not program
    inputs (so not in the measured peak): torch.optim's per-parameter 'step' counters, which
    the new program reads as Python floats. 0 for the old version (its state is all inputs)."""
    opt = getattr(step, "optimizer", None)     # the old Step's .optimizer is peakcut's own spec
    if not isinstance(opt, torch.optim.Optimizer):
        return 0, 0
    held = {t.untyped_storage().data_ptr() for t in step.bind(model, batch)}
    n = size = 0
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.untyped_storage().data_ptr() not in held:
                n, size = n + 1, size + v.untyped_storage().nbytes()
    return n, size


def measured(step: Any, model: torch.nn.Module, batch: Any, repeats: int) -> dict[str, Any]:
    m = peakcut.measure(step, model, batch, method="cpu-profiler", repeats=repeats)
    n, size = state_outside_inputs(step, model, batch)
    return {"peak_bytes": int(m.peak_bytes), "input_bytes": int(m.input_bytes),
            "step_seconds": m.seconds, "method": m.method, "device": m.device,
            "state_tensors_outside_inputs": n, "state_bytes_outside_inputs": size}


def loop_steps(call: Any, model: torch.nn.Module, batch: Any, sched: Any, n: int = 2) -> list[float]:
    """n real steps of the user's loop (step, then scheduler.step()); the lrs they ran with."""
    lrs = []
    for _ in range(n):
        lrs.append(sched.get_last_lr()[0])
        if isinstance(call, peakcut.Step):
            call(model, batch)
        else:
            call(batch)             # plan.step
        sched.step()
    return lrs


def run_workload(name: str, *, new: bool, repeats: int, time_budget: float, max_states: int) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def fresh() -> Any:
        return get_workload(name).build("tiny")

    # 1. "adamw": the captured description (old: constants in the program; new: a fresh torch.optim.AdamW)
    t0 = time.perf_counter()
    inst = fresh()
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    step = peakcut.build(g)
    out["adamw"] = {**measured(step, inst.model, inst.batch, repeats), **simulated(g, step.order),
                    "seconds": round(time.perf_counter() - t0, 2)}
    print(f"  {name} adamw: {out['adamw']['peak_bytes']:,} B", file=sys.stderr, flush=True)

    # 2. the user's AdamW (two groups) with a LambdaLR schedule (new only)
    if new:
        t0 = time.perf_counter()
        inst = fresh()
        opt, sched = user_optimizer(inst.model)
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, opt)
        step = peakcut.build(g, optimizer=opt)
        lrs = loop_steps(step, inst.model, inst.batch, sched)
        out["user"] = {**measured(step, inst.model, inst.batch, repeats), **simulated(g, step.order),
                       "param_groups": len(opt.param_groups), "lrs_run": lrs,
                       "lr_at_measure": opt.param_groups[0]["lr"],
                       "seconds": round(time.perf_counter() - t0, 2)}
        print(f"  {name} user: {out['user']['peak_bytes']:,} B", file=sys.stderr, flush=True)

    # 3. a searched plan, "adamw"; 4. (new only) the same with the user's optimizer
    variants = [("plan", "adamw")] + ([("plan_user", "user")] if new else [])
    for key, which in variants:
        t0 = time.perf_counter()
        inst = fresh()
        opt = sched = None
        optimizer: Any = "adamw"
        if which == "user":
            opt, sched = user_optimizer(inst.model)
            optimizer = opt
        limit_met = True
        try:
            plan = peakcut.optimize(inst.model, inst.batch, inst.loss_fn, optimizer, latency_limit=1.1,
                                    time_budget=time_budget, max_states=max_states, device="h200")
        except peakcut.LimitNotMet as e:
            plan, limit_met = e.plan, False
        step = plan.program
        entry: dict[str, Any] = {"limit_met": limit_met,
                                 "report_peak_ratio": plan.report.get("peak_ratio"),
                                 "report_latency_ratio": plan.report.get("latency_ratio"),
                                 "applied": list(plan.report.get("applied", [])),
                                 "states": plan.report.get("search", {}).get("states")}
        if sched is not None:
            entry["lrs_run"] = loop_steps(plan.step, inst.model, inst.batch, sched)
            entry["lr_at_measure"] = opt.param_groups[0]["lr"]
        entry.update(measured(step, inst.model, inst.batch, repeats))
        entry.update(simulated(step.graph, step.order))
        entry["seconds"] = round(time.perf_counter() - t0, 2)
        out[key] = entry
        print(f"  {name} {key}: {entry['peak_bytes']:,} B", file=sys.stderr, flush=True)
    return out


def collect(args: argparse.Namespace) -> dict[str, Any]:
    new = user_optimizer_api()
    info = source_info()
    print(f"peakcut from {info['peakcut_file']} (commit {info.get('commit')}); "
          f"user-optimizer API: {new}", file=sys.stderr, flush=True)
    result: dict[str, Any] = {
        "label": args.label, "user_optimizer_api": new, **info,
        "torch": torch.__version__, "python": platform.python_version(), "cpu": cpu_model(),
        "threads": torch.get_num_threads(), "peakcut_cache": os.environ.get("PEAKCUT_CACHE"),
        "repeats": args.repeats, "time_budget": args.time_budget, "max_states": args.max_states,
        "workloads": {},
    }
    for name in args.workloads:
        result["workloads"][name] = run_workload(name, new=new, repeats=args.repeats,
                                                 time_budget=args.time_budget, max_states=args.max_states)
    return result


def _b(x: int | None) -> str:
    return "n/a" if x is None else f"{x:,} B"


def _r(new: int | None, old: int | None) -> str:
    if new is None or old is None or not old:
        return ""
    return f" ({new / old:.4f}x)"


def compare(old: dict[str, Any], new: dict[str, Any]) -> str:
    lines = []
    lines.append(f"Old: {old['label']} = peakcut {old.get('commit')} ({old['peakcut_file']}); "
                 f"new: {new['label']} = peakcut {new.get('commit')} ({new['peakcut_file']})"
                 + (f", with local edits to src/: {', '.join(new['src_local_changes'])}"
                    if new.get("src_local_changes") else ""))
    lines.append("")
    lines.append("| workload | old (constants) peak | new (\"adamw\") peak | new (user AdamW, 2 groups + schedule) peak "
                 "| old plan peak | new plan peak (\"adamw\") | new plan peak (user AdamW, 2 groups + schedule) |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    higher = []
    for name, o in old["workloads"].items():
        n = new["workloads"].get(name, {})
        ob, op = o["adamw"]["peak_bytes"], o["plan"]["peak_bytes"]
        cells = [_b(ob)]
        for key, ref in (("adamw", ob), ("user", ob)):
            v = n.get(key, {}).get("peak_bytes")
            cells.append(_b(v) + _r(v, ref))
            if v is not None and v > ref:
                higher.append(f"{name} {key}: {v:,} > {ref:,}")
        cells.append(_b(op))
        for key in ("plan", "plan_user"):
            v = n.get(key, {}).get("peak_bytes")
            cells.append(_b(v) + _r(v, op))
            if v is not None and v > op:
                higher.append(f"{name} {key}: {v:,} > {op:,}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Ratios are new / old (the step columns against the old step, the plan columns against "
                 "the old plan).")
    lines.append("")
    lines.append(f"How: measured, CPU allocator events via torch.profiler (peakcut.measure(method=\"cpu-profiler\"), "
                 f"repeats={new['repeats']}: the c10 CPU allocator's alloc/free events of one step after a warm-up and "
                 f"the timed repeats, summed in order; peak = that running sum's peak + the caller-held input bytes "
                 f"(parameters, buffers, optimizer state, batch)). Tiny workloads, fp32, AdamW lr {LR:g}, weight decay "
                 f"{WEIGHT_DECAY:g} (user AdamW: 0.01 on matrices, 0.0 on biases/norms; LambdaLR linear warm-up over "
                 f"{WARMUP} steps, two real steps + scheduler.step() before measuring). Plans: peakcut.optimize(..., "
                 f"latency_limit=1.1, time_budget={new['time_budget']:g}, max_states={new['max_states']}, "
                 f"device=\"h200\"), plan.program measured the same way. CPU: {new['cpu']}; torch {new['torch']}, "
                 f"{new['threads']} threads.")
    lines.append("")
    lines.append("Diagnostics (simulated, cpu workspace model; input = caller-held bytes as measured):")
    lines.append("")
    lines.append("| workload | variant | version | measured peak | input bytes | simulated peak | simulated peak at "
                 "| optimizer-phase simulated peak | at | optimizer nodes | optimizer.state outside inputs |")
    lines.append("|---|---|---|---:|---:|---:|---|---:|---|---:|---:|")
    for name, o in old["workloads"].items():
        n = new["workloads"].get(name, {})
        for key in ("adamw", "user", "plan", "plan_user"):
            for label, d in ((old["label"], o.get(key)), (new["label"], n.get(key))):
                if not d:
                    continue
                lines.append(f"| {name} | {key} | {label} | {_b(d['peak_bytes'])} | {_b(d['input_bytes'])} "
                             f"| {_b(d['sim_peak_bytes'])} | {d['sim_peak_node']} | "
                             f"{_b(d['sim_optimizer_peak_bytes'])} | {d['sim_optimizer_peak_node']} | {d['optimizer_nodes']} | "
                             f"{d.get('state_tensors_outside_inputs', 0)} tensors, "
                             f"{_b(d.get('state_bytes_outside_inputs', 0))} |")
    lines.append("")
    lines.append("Higher than old: " + ("; ".join(higher) if higher else "none"))
    lines.append("")
    lines.append("Not in any measured figure: tensors of the step's torch.optim optimizer.state that are not "
                 "program inputs (torch.optim's per-parameter 0-d 'step' counters in the new version, read by "
                 "the program as Python floats; the old version's one shared step counter is an input). See the "
                 "last diagnostics column; an eager torch.optim loop holds the same tensors.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--label", default="run")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("OLD_JSON", "NEW_JSON"),
                    help="print the table from two runs' JSON files and exit")
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-budget", type=float, default=20.0)
    ap.add_argument("--max-states", type=int, default=16)
    args = ap.parse_args(argv)
    if args.compare:
        old, new = (json.loads(p.read_text()) for p in args.compare)
        print(compare(old, new))
        return 0
    warnings.simplefilter("ignore", UserWarning)
    result = collect(args)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
