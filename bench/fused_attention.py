"""Fused attention at paper size: GPT-Neo-1.3B's and BTLM-3B's AdamW steps (captured over
FakeTensors; nothing runs) before and after every written-out attention runs as the fused
attention PyTorch picks here (rules.fused_attention_rule), in capture order: the simulated peak
(peakcut.memory.simulate) and the simulated latency (the H100 analytic profile).

    python -m bench.fused_attention [--workloads gpt-neo-1.3b btlm-3b]
"""

from __future__ import annotations

import argparse
import time

import torch

import peakcut
from peakcut.cost import get_cost_model
from peakcut.memory import simulate
from peakcut.rules.fused_attention_rule import FusedAttentionRule
from peakcut.rules.query import Query
from peakcut.simulate import simulate_timeline

GIB = 2 ** 30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["gpt-neo-1.3b", "btlm-3b"])
    parser.add_argument("--size", default="paper")
    args = parser.parse_args()
    from peakcut.workloads import get_workload
    torch.set_num_threads(1)
    cost = get_cost_model("h100")
    rule = FusedAttentionRule()
    print("| workload | attentions fused | peak before | peak after | latency before | latency after |")
    print("|---|---|---|---|---|---|")
    for name in args.workloads:
        start = time.perf_counter()
        inst = get_workload(name).build(args.size)
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        sites = list(rule.sites(Query(g, g.order)))
        if not sites:
            print(f"| {inst.description} | 0 | - | - | - | - |")
            continue
        rw = rule.apply(g, g.order, sites[0])
        before, after = simulate(g, list(g.order)), simulate(rw.graph, list(rw.order))
        t0 = simulate_timeline(g, list(g.order), cost).latency_seconds
        t1 = simulate_timeline(rw.graph, list(rw.order), cost).latency_seconds
        print(f"| {inst.description} | {len(sites[0].nodes)} | {before.peak_bytes / GIB:.1f} GiB | "
              f"{after.peak_bytes / GIB:.1f} GiB ({after.peak_bytes / before.peak_bytes:.0%}) | "
              f"{t0:.3f} s | {t1:.3f} s |")
        print(f"<!-- {name}: {time.perf_counter() - start:.0f} s, capture included (measured) -->")


if __name__ == "__main__":
    main()
