"""One workload at medium size, optimized on this CPU with the limit verified by running it.

    python -m bench.verified resnet50 --budget 300

peakcut.optimize(..., "adamw", latency_limit=1.10, device="measured") on the medium
instance: the search prices ops measured here (predicted figures), then runs the candidate
plans for real, interleaved with the eager AdamW step (measured figures; see
peakcut.optimizer.verify). Prints the report's predicted and measured figures.
"""

from __future__ import annotations

import argparse
import time

import peakcut
from peakcut.workloads import WORKLOAD_NAMES, get_workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workload", choices=WORKLOAD_NAMES)
    p.add_argument("--budget", type=float, default=300.0, help="time budget in seconds (default 300)")
    p.add_argument("--latency-limit", type=float, default=1.10)
    args = p.parse_args()
    inst = get_workload(args.workload).build("medium")
    t0 = time.perf_counter()
    try:
        plan = peakcut.optimize(inst.model, inst.batch, inst.loss_fn, "adamw", latency_limit=args.latency_limit,
                                device="measured", time_budget=args.budget)
        status = "limit met"
    except peakcut.LimitNotMet as e:
        plan, status = e.plan, f"LimitNotMet: {e}"
    r = plan.report
    s = r["search"]
    print(f"{inst.description}: {status}; wall {time.perf_counter() - t0:.0f} s (budget {args.budget:.0f} s); "
          f"search {s['total_seconds']} s, {s['states']} states ({s['stopped']}); predicted peak "
          f"x{r['peak_ratio']:.3f}, latency x{r['latency_ratio']:.3f}")
    print(f"  memory: {r['memory_method']}")
    v = r.get("verification", {})
    if "skipped" in v:
        print(f"  verification skipped: {v['skipped']}")
        return
    e = v["eager"]
    print(f"  verification {v['seconds']} s, {v['method']}; eager median {e['median_s']:.3f} s "
          f"({e['min_s']:.3f}-{e['max_s']:.3f}), peak {e['peak_bytes'] / 2**30:.3f} GiB; noise band "
          f"{v['noise_band']:.3f}; limit x{v['limit']:.3f} eager; kept: {v['chosen']}")
    for c in v["candidates"]:
        print(f"    {c['name']}: median {c['median_s']:.3f} s ({c['min_s']:.3f}-{c['max_s']:.3f}), "
              f"x{c['ratio_to_eager']:.3f} eager per round; peak {c['peak_bytes'] / 2**30:.3f} GiB = "
              f"x{c['peak_bytes'] / e['peak_bytes']:.3f}; meets the limit: {c['meets_limit']}")
    for f in v.get("failed", []):
        print(f"    {f['name']}: could not run ({f['why']})")


if __name__ == "__main__":
    main()
