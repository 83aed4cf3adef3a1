"""python -m bench.measured --cold-warm: a device-measured search from an empty cost cache
against the same search from a warm one, per workload at medium size.

Per workload, in a process of its own: peakcut.optimize(device="measured",
latency_limit=1.10, time_budget=90) on a fresh copy of the model with its own AdamW, with
PEAKCUT_CACHE pointing at a new empty directory (cold), then again with the same directory,
which the cold run filled (warm). Each plan's peak is measured right after its call (the
caller-held bytes plus the CPU allocator's peak over one plan.step, bench.measured.run.peak_of)
and its report's phases (capture, calibration, search and the measuring inside it, reprice,
verification: peakcut.optimizer.phases) and states are kept. The table goes to
bench/measured/cold_cache_run.md, the raw figures to bench/measured/cold_warm.json.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench.measured.configs import build_eager, build_peakcut
from bench.measured.run import peak_of
from peakcut.workloads import WORKLOAD_NAMES, get_workload

HERE = Path(__file__).parent
TABLE = HERE / "cold_cache_run.md"
RAW = HERE / "cold_warm.json"
LATENCY_LIMIT = 1.10
BUDGET = 90.0
WITHIN = 0.05
"""The cold plan's measured peak is to be within this of the warm plan's."""
PHASES = ("capture", "calibration", "search", "reprice", "verification")


def one_run(name: str, cache: Path, budget: float = BUDGET) -> dict[str, Any]:
    """peakcut.optimize on a fresh copy of workload `name` (medium) with its cost cache in
    `cache`: the report's phases, states and plan figures, and the plan's measured peak."""
    os.environ["PEAKCUT_CACHE"] = str(cache)
    inst = get_workload(name).build("medium")
    eager = build_eager(inst)
    eager.step()
    eager_peak, _, held = peak_of(eager, inst.batch)
    eager_s = min(_timed(eager.step) for _ in range(2))
    del eager
    built = build_peakcut(inst, "latency_limit", LATENCY_LIMIT, budget)
    wall, note, plan = built.setup_seconds, built.note, built.plan
    built.step()
    peak, _, _ = peak_of(built, inst.batch)
    r = plan.report
    v = r.get("verification", {})
    return {"workload": name, "wall_s": round(wall, 2), "eager_step_s": round(eager_s, 3),
            "eager_peak_bytes": eager_peak, "held_bytes": held, "peak_bytes": peak,
            "verified_peak_bytes": r.get("measured", {}).get("peak_bytes"),
            "phases": r.get("phases", {}), "search_states": r.get("search", {}).get("states"),
            "stopped": r.get("search", {}).get("stopped"), "repriced": r.get("repriced"),
            "context": {k: r.get("context", {}).get(k) for k in ("factor", "skipped", "measure_s", "unmeasured_calls")},
            "verification": v.get("skipped") or v.get("chosen"), "rounds": v.get("eager", {}).get("runs"),
            "applied": len(r.get("applied", [])), "feasible": r.get("feasible"), "note": note}


def _timed(step: Any) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def workload_pair(name: str, budget: float = BUDGET) -> dict[str, Any]:
    """The cold run, then the warm run on the cache the cold one filled."""
    with tempfile.TemporaryDirectory(prefix="peakcut-cold-") as cache:
        cold = one_run(name, Path(cache), budget)
        warm = one_run(name, Path(cache), budget)
    return {"workload": name, "cold": cold, "warm": warm}


def _phase(run: dict[str, Any], name: str) -> str:
    s = run["phases"].get("seconds", {}).get(name)
    return "-" if s is None else f"{s:.1f}"


def _measuring(run: dict[str, Any]) -> str:
    s = run["phases"].get("measuring_in_search_s")
    return "-" if s is None else f"{s:.1f}"


def _states(run: dict[str, Any]) -> str:
    states = run["phases"].get("states", {})
    return f"{states.get('search', '-')} / {states.get('verification', '-')}"


def markdown(pairs: list[dict[str, Any]], env: str, budget: float = BUDGET) -> str:
    """The table (module doc) and the checks of the acceptance bullet."""
    head = ("| workload | run | " + " | ".join(f"{p} s" for p in PHASES[:3])
            + " | of which measuring s | " + " | ".join(f"{p} s" for p in PHASES[3:])
            + " | total s | search share | states: search / plans verified | measured peak GiB (x eager) | "
            "cold / warm peak | plan |")
    lines = [
        f"Command: `python -m bench.measured --cold-warm` (bench/measured/cold_warm.py; raw figures in "
        f"bench/measured/cold_warm.json). Measured on this CPU: {env}. Per workload at medium size: "
        f"`peakcut.optimize(..., device=\"measured\", latency_limit={LATENCY_LIMIT:.2f}, time_budget={budget:g})` "
        "from an empty cost cache (cold), then again on the cache it filled (warm), each on a fresh copy "
        "of the model with its own AdamW. Phases: report[\"phases\"] (peakcut.optimizer.phases); search "
        "includes the slices of measuring between its expansions (next column). Peak: caller-held bytes plus the CPU allocator's "
        "peak over one plan.step (torch.profiler memory events), measured after each call.",
        "", head, "|" + "---|" * (head.count("|") - 1)]
    met_share, met_peak = [], []
    for pair in pairs:
        cold, warm = pair["cold"], pair["warm"]
        ratio = cold["peak_bytes"] / warm["peak_bytes"] if warm["peak_bytes"] else float("nan")
        for label, run in (("cold", cold), ("warm", warm)):
            share = run["phases"].get("search_share")
            lines.append(
                f"| {pair['workload']} | {label} | " + " | ".join(_phase(run, p) for p in PHASES[:3])
                + f" | {_measuring(run)} | " + " | ".join(_phase(run, p) for p in PHASES[3:])
                + f" | {run['phases'].get('total_s', run['wall_s']):.1f} | "
                + (f"{share:.0%}" if share is not None else "-") + f" | {_states(run)} | "
                + f"{run['peak_bytes'] / 2**30:.2f} (x{run['peak_bytes'] / run['eager_peak_bytes']:.3f}) | "
                + (f"x{ratio:.3f}" if label == "cold" else "") + f" | {run['applied']} changes; "
                + f"{run['verification']}{'; ' + run['note'] if run['note'] else ''} |")
        if (cold["phases"].get("search_share") or 0) >= 0.5:
            met_share.append(pair["workload"])
        if abs(ratio - 1) <= WITHIN:
            met_peak.append(pair["workload"])
    n = len(pairs)
    lines += ["", f"- cold runs searching at least half the budget: {len(met_share)} of {n} "
              f"({', '.join(met_share) or 'none'}).",
              f"- cold plan's measured peak within {WITHIN:.0%} of the warm plan's: {len(met_peak)} of {n} "
              f"({', '.join(met_peak) or 'none'})."]
    return "\n".join(lines) + "\n"


def environment() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
            f"{torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
            f"{os.getloadavg()[1]:.1f} over the last 5 minutes ({cores} cores; above that, other processes "
            "slowed every step)")


def main(names: list[str], budget: float = BUDGET, write: bool = True) -> str:
    """Every workload in a process of its own, then the table: of these workloads and, with
    `write`, of those cold_warm.json holds from earlier runs (each pair says when it ran)."""
    pairs = []
    for name in names:
        done = subprocess.run([sys.executable, "-m", "bench.measured.cold_warm", name, str(budget)],
                              check=False, capture_output=True, text=True)
        last = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
        if done.returncode != 0 or not last:
            print(f"{name}: failed (exit {done.returncode}): {done.stderr.strip()[-500:]}", file=sys.stderr)
            continue
        pairs.append(dict(json.loads(last[0]), env=environment()))
        print(f"{name}: done", file=sys.stderr, flush=True)
    if write:
        done = {p["workload"] for p in pairs}
        kept = [p for p in (json.loads(RAW.read_text())["pairs"] if RAW.exists() else []) if p["workload"] not in done]
        pairs = sorted(kept + pairs, key=lambda p: WORKLOAD_NAMES.index(p["workload"])
                       if p["workload"] in WORKLOAD_NAMES else len(WORKLOAD_NAMES))
    envs = sorted({f"{p['workload']}: {p.get('env', '?')}" for p in pairs})
    text = markdown(pairs, "; ".join(envs), budget)
    if write:
        RAW.write_text(json.dumps({"pairs": pairs}, indent=1))
        TABLE.write_text(text)
    return text


if __name__ == "__main__":
    print(json.dumps(workload_pair(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else BUDGET)))
