"""What a CPU process holds while a plan trains, measured: its resident memory before
`optimize` against the kernel's high-water mark during the plan's steps.

    python -m bench.host_memory                       # GPT-2-like, analytic CPU profile, by default and without the arena
    python -m bench.host_memory --device measured     # the measured cost model (verification, mallopt)
    python -m bench.host_memory --workload bert-base  # a workload at medium size instead
    python -m bench.host_memory --repeat 3            # three processes per row

One process per row (each row starts from a fresh interpreter): build the model and batch,
read VmRSS, run `peakcut.optimize(latency_limit=1.10)` (arena: its default, which places a CPU
plan's results in an arena, then arena=False), run one step, reset the high-water mark
(`/proc/self/clear_refs`, 5), run three steps and read VmHWM. "needs" is what the plan reports
it needs beyond the caller's parameters and batch: with the arena, held + arena + unplanned
(report["arena"]["needed_bytes"]); without one, the bytes the allocator is predicted to hold
(report["predicted_reserved_bytes"]: glibc's malloc modelled as the process runs it,
peakcut.memory.host_heap); less the parameters' and the batch's bytes. "live" is the plan's
simulated live peak (report["peak_bytes"]) less the same. The bound checked: grown <= 1.05 x needs +
100 MiB (peakcut's own objects). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

MiB = 2**20
ROW = """
import json, sys, torch, peakcut
from bench.host_memory import measure
print(json.dumps(measure(*json.loads(sys.argv[1]))))
"""


def _status() -> dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}


def _gpt2_like() -> tuple[Any, Any, Any]:
    """The GPT-2-like step of the issue: 4 layers, width 256, batch 8 x 256, AdamW."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=8192, n_positions=256))
    ids = torch.randint(0, 8192, (8, 256))
    return model, (ids,), lambda m, b: m(input_ids=b[0], labels=b[0]).loss


def measure(workload: str, device: str, arena: bool | None, budget: float) -> dict[str, Any]:
    """One row, in this process (see the module doc); arena None: optimize's default."""
    import torch

    import peakcut
    from peakcut.workloads import get_workload

    if workload == "gpt2-like":
        model, batch, loss_fn = _gpt2_like()
    else:
        inst = get_workload(workload).build("medium")
        model, batch, loss_fn = inst.model, inst.batch, inst.loss_fn
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    before = _status()["VmRSS"]
    t0 = time.perf_counter()
    plan = peakcut.optimize(model, batch, loss_fn, opt, latency_limit=1.10, device=device, time_budget=budget,
                            arena=arena)
    optimize_s = time.perf_counter() - t0
    after = _status()["VmRSS"]
    plan.step(batch)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    step_s = []
    for _ in range(3):
        t = time.perf_counter()
        plan.step(batch)
        step_s.append(time.perf_counter() - t)
    high = _status()["VmHWM"]
    report = plan.report
    caller = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        t.numel() * t.element_size() for t in torch.utils._pytree.tree_leaves(batch) if isinstance(t, torch.Tensor))
    placed = "arena" in report            # the plan runs with its arena (the default on a CPU)
    planned = report["arena"]["needed_bytes"] if placed else report["predicted_reserved_bytes"]
    needs = planned - caller
    grown = high - before
    return {"workload": workload, "device": device, "arena": "default" if arena is None else arena, "placed": placed,
            "before_mib": before / MiB,
            "after_optimize_mib": after / MiB, "steps_high_water_mib": high / MiB, "grown_mib": grown / MiB,
            "live_mib": (report["peak_bytes"] - caller) / MiB, "needs_mib": needs / MiB,
            "reserved_method": report["layout"]["reserved_method"], "bound_mib": (1.05 * needs + 100 * MiB) / MiB,
            "within": grown <= 1.05 * needs + 100 * MiB, "optimize_s": optimize_s, "step_s": step_s}


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="gpt2-like", help="gpt2-like, or a workload name (medium size)")
    ap.add_argument("--device", default="cpu", help="the cost model: cpu (analytic) or measured")
    ap.add_argument("--budget", type=float, default=20.0, help="optimize's time budget, seconds")
    ap.add_argument("--repeat", type=int, default=1, help="processes per row (the heap's layout varies run to run)")
    args = ap.parse_args(argv)
    rows = []
    for arena in [None, False] * args.repeat:
        spec = json.dumps([args.workload, args.device, arena, args.budget])
        out = subprocess.run([sys.executable, "-c", ROW, spec], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| workload | device | arena | RSS before optimize | after optimize | steps' high-water | grown | "
          "plan's live peak | plan needs | grown / needs | bound (1.05 x needs + 100) | within |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        arena = f"{'yes' if r['placed'] else 'no'} ({'default' if r['arena'] == 'default' else 'arena=False'})"
        print(f"| {r['workload']} | {r['device']} | {arena} | {r['before_mib']:.0f} MiB | "
              f"{r['after_optimize_mib']:.0f} | {r['steps_high_water_mib']:.0f} | {r['grown_mib']:.0f} | "
              f"{r['live_mib']:.0f} | {r['needs_mib']:.0f} | {r['grown_mib'] / r['needs_mib']:.2f} | "
              f"{r['bound_mib']:.0f} | {'yes' if r['within'] else 'no'} |")
    for r in rows:
        steps = ", ".join(f"{t:.2f}" for t in r["step_s"])
        print(f"arena={r['arena']}: optimize took {r['optimize_s']:.1f} s; steps 2-4 took {steps} s; "
              f"{r['reserved_method']}")
    return rows


if __name__ == "__main__":
    main()
