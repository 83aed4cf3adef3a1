"""Same plans before and after a refactor: fixed-effort searches on the seven paper workloads.

    python -m bench.same_plans --write bench/same_plans.json   # record (on the old code)
    python -m bench.same_plans --check bench/same_plans.json   # compare (on the new code)
    python -m bench.same_plans --check bench/same_plans.json --without cancel_transposes
                                                              # the same searches without a rule

For every paper-size workload (AdamW step over FakeTensors; nothing runs) and both modes
(least memory within 10% latency; least latency within 40% of eager memory), one search
bounded by a number of states, not by the clock: `max_states` states, one process, a time
budget far above what the states need (so no clock-driven cut-off is reached). The record
holds, per search: eager and best simulated peak (bytes) and latency (seconds, RTX 3090
analytic profile), the applied transformations, the fission choice and the recipes.
`--check` fails on any difference: peaks to the byte, latencies to float rounding (1e-9
relative), lists exactly. All figures are simulated.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

import peakcut
from peakcut.optimizer import optimize_graph
from peakcut.rules import RULES, Registry
from peakcut.workloads import WORKLOAD_NAMES, get_workload

SETTINGS = (("latency", 1.10), ("memory", 0.4))
LATENCY_RTOL = 1e-9


def run(workloads: list[str], max_states: int, device: str, rules: Registry = RULES) -> dict[str, dict]:
    """One fixed-effort search per workload and setting (with `rules`); a record per search."""
    torch.set_num_threads(1)
    records: dict[str, dict] = {}
    for name in workloads:
        inst = get_workload(name).build("paper")
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        for mode, value in SETTINGS:
            kw = {"latency_limit": value} if mode == "latency" else {"memory_limit": value}
            t0 = time.perf_counter()
            r = optimize_graph(g, time_budget=1e6, max_states=max_states, device=device, rules=rules,
                               **kw).report
            key = f"{name}/{mode}<={value}"
            records[key] = {
                "nodes": len(g.nodes), "eager_peak_bytes": r["eager_peak_bytes"],
                "eager_latency_s": r["eager_latency_s"], "peak_bytes": r["peak_bytes"],
                "latency_s": r["latency_s"], "feasible": r["feasible"], "applied": r["applied"],
                "fission": r["fission"], "recipes": r["recipes"], "states": r["search"]["states"],
                "stopped": r["search"]["stopped"],
            }
            print(f"{key}: {len(g.nodes)} nodes, peak {r['peak_ratio']:.2%}, latency "
                  f"x{r['latency_ratio']:.3f}, {r['search']['states']} states, "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return records


def differences(old: dict[str, dict], new: dict[str, dict]) -> list[str]:
    """Every field that differs between two records (latencies within LATENCY_RTOL)."""
    out = []
    for key in sorted(set(old) | set(new)):
        if key not in old or key not in new:
            out.append(f"{key}: only in {'new' if key not in old else 'old'}")
            continue
        for field, was in old[key].items():
            now = new[key].get(field)
            if isinstance(was, float) and isinstance(now, float):
                same = math.isclose(was, now, rel_tol=LATENCY_RTOL, abs_tol=0.0)
            else:
                same = was == now
            if not same:
                out.append(f"{key}: {field} was {was!r}, now {now!r}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", type=Path, help="record the searches to this JSON file")
    ap.add_argument("--check", type=Path, help="compare the searches with this record")
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOAD_NAMES))
    ap.add_argument("--max-states", type=int, default=40, help="states per search (default 40)")
    ap.add_argument("--device", default="rtx3090")
    ap.add_argument("--without", nargs="*", default=[], metavar="KIND",
                    help="search with RULES less these rewrite rules (does a rule change the plans?)")
    args = ap.parse_args()
    unknown = sorted(set(args.without) - set(RULES.rewrite_kinds))
    if unknown:
        ap.error(f"--without: {unknown} are not rewrite rules of RULES {RULES.rewrite_kinds}")
    rules = Registry(regions=RULES.regions, programs=RULES.programs,
                     rewrites=tuple(r for r in RULES.rewrites if r.kind not in args.without))
    if (args.write is None) == (args.check is None):
        ap.error("give --write FILE or --check FILE")
    records = run(args.workloads, args.max_states, args.device, rules)
    if args.write is not None:
        args.write.write_text(json.dumps({"max_states": args.max_states, "device": args.device,
                                          "records": records}, indent=1) + "\n")
        print(f"wrote {len(records)} searches to {args.write}")
        return
    old = json.loads(args.check.read_text())
    if (old["max_states"], old["device"]) != (args.max_states, args.device):
        ap.error(f"{args.check} was recorded with max_states={old['max_states']}, device={old['device']}")
    wanted = {k: v for k, v in old["records"].items() if k.split("/")[0] in args.workloads}
    diffs = differences(wanted, records)
    for line in diffs:
        print(line)
    print(f"{len(records)} searches, {len(diffs)} differences")
    sys.exit(1 if diffs else 0)


if __name__ == "__main__":
    main()
