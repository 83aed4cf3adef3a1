"""Eager against peakcut on a CUDA GPU, run for real (issue 16, item 7).

    python -m bench.gpu                                   # every workload at paper size, cuda:0
    python -m bench.gpu resnet50 bert-base --size tiny --budget 5 --out /tmp/gpu

Each workload runs in a process of its own (a crash, a hang or an out-of-memory error is that
workload's row, not the end of the run), under one deadline for the whole run (--deadline).
One workload's process:

1. builds the workload on the GPU: the paper's network and batch (or --batch), random
   weights, seed 0 (Workload.build(..., device="cuda"));
2. eager, the user's loop (AdamW lr 1e-4; loss, backward, step, grads to None): step 1's
   loss, first moments and parameters are kept on the host for the number check; then a
   warm-up step, the peak over one step (torch.cuda.max_memory_allocated and
   max_memory_reserved after empty_cache and reset_peak_memory_stats: the whole process,
   weights and optimizer state included) and --runs steps, each timed by CUDA events on the
   current stream and by the wall clock between two device-wide synchronizes (which waits
   for a plan's copy streams too);
3. the weights are put back, and peakcut.optimize(model, batch, loss_fn, <a fresh AdamW>,
   device="measured", <limit>, time_budget=--budget) plans the step: the search prices calls
   timed on this GPU and verification runs candidate plans against eager for real; the
   plan's step 1 is checked against eager's, then peak and times as for eager.

TF32 is off (matmul and cuDNN) for both, so that the number check is float32's. Eager's
step is also captured and simulated, with the memory model plans made here use (on a GPU each
call's workspace measured on it, memory/workspace/cuda.py) and with the CPU model, beside
eager's measured max_memory_allocated; the plan's predicted peak beside its measured one.
Results: results.json (every figure) and results.md (the table) in --out, rewritten after
each workload; log.txt, every process's output.

Without CUDA it runs on the CPU as a dry run of itself (peak from the CPU allocator's events
plus the caller-held bytes, times by perf_counter).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import peakcut
from bench.measured.configs import adamw, eager_step
from bench.peers.measure import caller_held_bytes
from peakcut.memory import simulate
from peakcut.memory.workspace import describe_workspace
from peakcut.runtime import profiler_peak
from peakcut.runtime.equivalence import rounding_tolerance
from peakcut.workloads import WORKLOAD_NAMES, get_workload

WARMUP = 1
LIMITS = {"latency": ("latency_limit", 1.10), "memory": ("memory_limit", 0.5)}


# ---------------------------------------------------------------- one workload (child process)

def _timed_steps(step: Any, runs: int, held_bytes: int) -> dict[str, Any]:
    """Peak over one step, then `runs` steps each timed by CUDA events (seconds). On a CPU (a
    dry run of this bench): the CPU allocator's events plus `held_bytes`, and perf_counter."""
    if not torch.cuda.is_available():
        delta, _ = profiler_peak(step)
        peak = {"max_memory_allocated": held_bytes + delta, "max_memory_reserved": held_bytes + delta,
                "allocated_between_steps": held_bytes}
    else:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = {"max_memory_allocated": torch.cuda.max_memory_allocated(),
                "max_memory_reserved": torch.cuda.max_memory_reserved(),
                "allocated_between_steps": torch.cuda.memory_allocated()}
    times, walls = [], []
    for _ in range(runs):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()            # every stream: a plan's copy streams too
            walls.append(time.perf_counter() - t0)
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
            walls.append(times[-1])
    return {**peak, "times_s": times, "median_s": statistics.median(times), "min_s": min(times),
            "max_s": max(times), "wall_times_s": walls, "wall_median_s": statistics.median(walls)}


def _snapshot(model: Any, opt: Any, loss: Any) -> dict[str, Any]:
    """Step 1's results on the host: loss, parameters, first moments."""
    params = dict(model.named_parameters())
    return {"loss": loss.detach().to("cpu", torch.float64, copy=True),
            "params": {n: p.detach().to("cpu", copy=True) for n, p in params.items()},
            "exp_avg": {n: opt.state[p]["exp_avg"].detach().to("cpu", copy=True) for n, p in params.items() if p in opt.state}}


def _relative(pairs: Any) -> float:
    """||a - b|| / ||b|| over all (a, b) pairs together, in float64, one pair at a time."""
    diff = scale = 0.0
    for a, b in pairs:
        a, b = a.double(), b.double()
        diff += (a - b).square().sum().item()
        scale += b.square().sum().item()
    return math.sqrt(diff / scale) if scale > 0 else math.sqrt(diff)


def _number_check(eager: dict[str, Any], plan: dict[str, Any], init: dict[str, Any], dtype: Any,
                  reduction: int) -> dict[str, Any]:
    """Plan step 1 against eager step 1, norm-wise relative over all parameters together: the
    loss, the first moments (0.1 x the gradients) and the updates (new - initial weights).
    Tolerance: float32 rounding of a reduction of `reduction` terms
    (peakcut.runtime.equivalence.rounding_tolerance); a half-precision result is rounded
    once more from float32 accumulation."""
    tol = rounding_tolerance(torch.float32, reduction)
    if dtype in (torch.float16, torch.bfloat16):
        tol += rounding_tolerance(dtype, 1)
    names = sorted(eager["exp_avg"])
    missing = sorted(set(names) - set(plan["exp_avg"]))
    if missing:
        return {"tolerance": tol, "equal": False, "why": f"no first moment after the plan's step for {missing[:3]}"}
    figures = {
        "loss": _relative([(plan["loss"], eager["loss"])]),
        "moments": _relative((plan["exp_avg"][n], eager["exp_avg"][n]) for n in names),
        "updates": _relative((plan["params"][n].double() - init[n].double(),
                              eager["params"][n].double() - init[n].double()) for n in names),
    }
    worst = max(((_relative([(plan["exp_avg"][n], eager["exp_avg"][n])]), n) for n in names), default=(0.0, ""))
    return {"tolerance": tol, **figures, "equal": all(v <= tol for v in figures.values()),
            "worst_parameter_moments": {"name": worst[1], "relative": worst[0]}}


def _checksum(model: Any) -> float:
    return math.fsum(p.detach().double().sum().item() for p in model.parameters())


def _simulated_eager(inst: Any, opt: Any) -> dict[str, Any]:
    """Eager's step captured and simulated in capture order, with the memory model a plan made
    here uses (on a GPU: each call's workspace measured on it) and with the CPU model, for the
    measured peak to be compared with (memory/workspace/cuda.py)."""
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, opt)
    return {"peak_bytes": simulate(g, g.order, "auto").peak_bytes, "method": describe_workspace("auto", g.device),
            "cpu_model_peak_bytes": simulate(g, g.order, "cpu").peak_bytes}


def run_one(name: str, size: str, batch: int | None, limit: str, budget: float, runs: int) -> dict[str, Any]:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    row: dict[str, Any] = {"workload": name, "size": size, "limit": limit, "torch": torch.__version__,
                           "cuda": torch.version.cuda,
                           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)"}
    t0 = time.perf_counter()
    inst = get_workload(name).build(size, batch_size=batch, device=device)
    model = inst.model
    row.update(description=inst.description, build_s=round(time.perf_counter() - t0, 1),
               param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))
    print(f"[{name}] built {inst.description} in {row['build_s']} s", flush=True)
    init = {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters()}
    reduction = max(t.numel() for t in inst.batch)     # tokens, or pixels x channels: the longest weight-gradient sum

    # eager
    opt = adamw(model)
    step = eager_step(model, opt, lambda: inst.loss_fn(model, inst.batch))
    eager_1 = _snapshot(model, opt, step())
    for _ in range(WARMUP):
        step()
    row["eager"] = _timed_steps(step, runs, caller_held_bytes(model, opt, inst.batch))
    print(f"[{name}] eager: {row['eager']['median_s'] * 1e3:.1f} ms, peak "
          f"{row['eager']['max_memory_allocated'] / 2**30:.2f} GiB allocated, "
          f"{row['eager']['max_memory_reserved'] / 2**30:.2f} GiB reserved", flush=True)
    row["eager"]["simulated"] = _simulated_eager(inst, opt)
    del step, opt
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(init[n])
            p.grad = None
    torch.cuda.empty_cache()

    # peakcut
    opt = adamw(model)
    before = _checksum(model)
    kind, value = LIMITS[limit]
    t1 = time.perf_counter()
    try:
        plan = peakcut.optimize(model, inst.batch, inst.loss_fn, opt, device="measured",
                                time_budget=budget, **{kind: value})
        row["status"] = "limit met"
    except peakcut.LimitNotMet as e:
        plan = e.plan
        row["status"] = f"LimitNotMet: {str(e).splitlines()[0][:300]}"
    row["optimize_s"] = round(time.perf_counter() - t1, 1)
    row["model_unchanged_by_optimize"] = _checksum(model) == before
    report = plan.report
    row["report"] = report
    print(f"[{name}] optimize {row['optimize_s']} s: {row['status']}", flush=True)
    plan_1 = _snapshot(model, opt, plan.step(inst.batch))
    row["numbers"] = _number_check(eager_1, plan_1, init, inst.dtype, reduction)
    print(f"[{name}] numbers: {row['numbers']}", flush=True)
    del eager_1, plan_1
    for _ in range(WARMUP):
        plan.step(inst.batch)
    row["peakcut"] = _timed_steps(lambda: plan.step(inst.batch), runs, caller_held_bytes(model, opt, inst.batch))
    e, p = row["eager"], row["peakcut"]
    row["ratios"] = {"time": p["median_s"] / e["median_s"], "wall": p["wall_median_s"] / e["wall_median_s"],
                     "allocated": p["max_memory_allocated"] / e["max_memory_allocated"],
                     "reserved": p["max_memory_reserved"] / e["max_memory_reserved"]}
    print(f"[{name}] peakcut: {p['median_s'] * 1e3:.1f} ms (x{row['ratios']['time']:.3f}), peak "
          f"{p['max_memory_allocated'] / 2**30:.2f} GiB allocated (x{row['ratios']['allocated']:.3f}), "
          f"{p['max_memory_reserved'] / 2**30:.2f} GiB reserved (x{row['ratios']['reserved']:.3f})", flush=True)
    return row


# ---------------------------------------------------------------- the run (parent process)

def _table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | limit | eager ms (min-max) | peakcut ms (min-max) | time | allocated GiB eager -> plan | "
             "eager simulated GiB: this device's model (CPU model) | plan predicted GiB | "
             "reserved GiB eager -> plan | numbers | status |", "|" + " --- |" * 11]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['workload']} | {r['limit']} | | | | | | | | | error: {r['error'][:160]} |")
            continue
        e, p, q = r["eager"], r["peakcut"], r["ratios"]
        g = 2**30
        lines.append(
            f"| {r['description']} | {r['limit']} | {e['median_s'] * 1e3:.1f} ({e['min_s'] * 1e3:.1f}-{e['max_s'] * 1e3:.1f}) | "
            f"{p['median_s'] * 1e3:.1f} ({p['min_s'] * 1e3:.1f}-{p['max_s'] * 1e3:.1f}) | x{q['time']:.3f} (wall x{q['wall']:.3f}) | "
            f"{e['max_memory_allocated'] / g:.2f} -> {p['max_memory_allocated'] / g:.2f} (x{q['allocated']:.3f}) | "
            f"{_simulated(e)} | {r['report'].get('peak_bytes', float('nan')) / g:.2f} | "
            f"{e['max_memory_reserved'] / g:.2f} -> {p['max_memory_reserved'] / g:.2f} (x{q['reserved']:.3f}) | "
            f"{'equal' if r['numbers']['equal'] else 'DIFFER'} | {r['status'][:120]} |")
    return "\n".join(lines) + "\n"


def _simulated(eager: dict[str, Any]) -> str:
    sim = eager.get("simulated")
    if sim is None:
        return "-"
    return f"{sim['peak_bytes'] / 2**30:.2f} ({sim['cpu_model_peak_bytes'] / 2**30:.2f})"


def _run_child(name: str, limit: str, args: argparse.Namespace, end: float, out: Path) -> dict[str, Any]:
    """One workload under one limit in a process of its own, stopped at the run's deadline."""
    left = end - time.monotonic()
    row: dict[str, Any] = {"workload": name, "size": args.size, "limit": limit}
    if left < 20:
        row["error"] = "not run: the run's deadline"
        return row
    cmd = [sys.executable, "-m", "bench.gpu", f"{name}:{limit}", "--one", "--size", args.size,
           "--budget", str(args.budget), "--runs", str(args.runs)]
    if args.batch is not None:
        cmd += ["--batch", str(args.batch)]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=None if math.isinf(left) else left,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        text = done.stdout + done.stderr
        found = [ln for ln in done.stdout.splitlines() if ln.startswith("ROW ")]
        if found:
            row = json.loads(found[-1][4:])
        else:
            row["error"] = (text.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    except subprocess.TimeoutExpired as e:
        text = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        row["error"] = f"stopped at the run's deadline after {time.perf_counter() - t0:.0f} s"
    row["wall_s"] = round(time.perf_counter() - t0, 1)
    with (out / "log.txt").open("a") as log:
        log.write(f"==== {name} {limit}\n{text}\n")
    print(f"== {name} {limit}: {row.get('error') or row.get('status')} ({row['wall_s']} s)", flush=True)
    print("\n".join(ln for ln in text.splitlines() if not ln.startswith("ROW "))[-3000:], flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workloads", nargs="*", default=list(WORKLOAD_NAMES),
                   help="default: all seven; NAME:LIMIT (bert-base:memory) runs NAME under that limit only")
    p.add_argument("--size", default="paper", choices=("paper", "medium", "tiny"))
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the size's own)")
    p.add_argument("--limit", default=["latency"], nargs="+", choices=sorted(LIMITS))
    p.add_argument("--budget", type=float, default=30.0, help="peakcut's time_budget per plan, seconds")
    p.add_argument("--runs", type=int, default=10, help="timed steps of eager and of the plan")
    p.add_argument("--deadline", type=float, default=math.inf, help="seconds for the whole run")
    p.add_argument("--out", default="gpu-results")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    jobs = [(w.partition(":")[0], limit) for w in args.workloads
            for limit in ([w.partition(":")[2]] if ":" in w else args.limit)]
    unknown = [f"{w}:{lim}" for w, lim in jobs if w not in WORKLOAD_NAMES or lim not in LIMITS]
    if unknown:
        p.error(f"unknown workload or limit in {', '.join(unknown)}; workloads: {', '.join(WORKLOAD_NAMES)}; "
                f"limits: {', '.join(LIMITS)}")
    if args.one:
        row = run_one(jobs[0][0], args.size, args.batch, jobs[0][1], args.budget, args.runs)
        print("ROW " + json.dumps(row, default=str), flush=True)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + args.deadline
    rows: list[dict[str, Any]] = []
    for name, limit in jobs:
        rows.append(_run_child(name, limit, args, end, out))
        (out / "results.json").write_text(json.dumps(rows, indent=1, default=str))
        (out / "results.md").write_text(_table(rows))
    print(_table(rows))


if __name__ == "__main__":
    main()
