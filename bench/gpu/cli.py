"""The command line of `python -m bench.gpu`: the run (bench.gpu.runner) or, with --child,
one workload's process (bench.gpu.child), which waits for its slot on stdin."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.gpu.timeplan import LIMITS, ORDER, Effort


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.gpu",
                                description="Eager against peakcut's plans and the peers, measured on a CUDA GPU.")
    p.add_argument("workloads", nargs="*", default=list(ORDER),
                   help="default: all seven; NAME:LIMIT (bert-base:memory) runs NAME under that limit only")
    p.add_argument("--size", default="paper", choices=("paper", "medium", "tiny"))
    p.add_argument("--batch", type=int, default=None, help="batch size (default: the size's own)")
    p.add_argument("--limit", default=list(LIMITS), nargs="+", choices=list(LIMITS))
    p.add_argument("--budget", type=float, default=None,
                   help="optimize's time_budget for every plan, seconds (default: the time plan's share)")
    p.add_argument("--runs", type=int, default=None, help="timed steps of eager and of each plan (default: by workload)")
    p.add_argument("--peer-runs", type=int, default=None, help="timed steps of each peer (default: half of --runs)")
    p.add_argument("--slowdown", type=float, default=1.0,
                   help="this machine's time per workload over the H200 estimates the time plan uses (default 1)")
    p.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole run (default 540)")
    p.add_argument("--out", default="gpu-results", help="results.json, results.md, log.txt")
    p.add_argument("--logs", default=None, help="each workload's whole output (default: OUT/logs)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    args = p.parse_args(argv)
    if args.child is not None:
        from bench.gpu.child import prepare
        from bench.gpu.child import run as run_child

        prepare()                           # the imports, while the previous workload runs
        line = sys.stdin.readline()         # the slot, once it is done
        if line.strip():
            run_child(args.child, args.size, args.batch, json.loads(line))
        return
    from bench.gpu.runner import Settings, jobs_of, run

    jobs = jobs_of(args.workloads, args.limit)
    unknown = sorted({f"{w}:{lim}" for w, lim in jobs if w not in ORDER or lim not in LIMITS})
    if unknown:
        p.error(f"unknown workload or limit in {', '.join(unknown)}; workloads: {', '.join(ORDER)}; "
                f"limits: {', '.join(LIMITS)}")
    results = run(Settings(jobs, args.size, args.batch, Effort(args.runs, args.peer_runs, args.budget, args.slowdown),
                           args.deadline, Path(args.out), logs=Path(args.logs) if args.logs else None))
    print((Path(args.out) / "results.md").read_text())
    sys.exit(0 if results["rows"] else 1)
