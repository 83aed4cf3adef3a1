"""The fused substitutions at paper size: GPT-Neo-1.3B's and BTLM-3B's AdamW steps (captured
over FakeTensors, the loss detached as the search's root is; nothing runs) before and after
every written-out attention runs as the fused attention PyTorch picks here
(rules.fused_attention_rule), the language model's head and loss runs in chunks of the
sequence (rules.chunked_loss_rule), and both, in capture order: the simulated peak
(peakcut.memory.simulate) and the simulated latency (the H100 analytic profile).

    python -m bench.fused_attention [--workloads gpt-neo-1.3b btlm-3b] [--batch-size 1]
    python -m bench.fused_attention --search     # + the search with RULES, attention, WITH_FUSED
    python -m bench.fused_attention --check      # tiny size: both applied, 3 AdamW steps vs eager

--search: optimize_graph(latency_limit=1.1, device="h100", max_states=40, time_budget=inf) on
the same captured step with each registry (least memory within 10% of eager's latency,
simulated). --check: at tiny size, both substitutions applied, the step's loss, gradients,
parameters and AdamW state against eager PyTorch's over 3 steps (runs on this CPU).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

import torch

import peakcut
from peakcut.cost import get_cost_model
from peakcut.fission.loss import detach_loss
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.rules import RULES, WITH_FUSED, Registry
from peakcut.rules.query import Query
from peakcut.simulate import simulate_timeline
from peakcut.transform.rewrite import Rewrite

GIB = 2 ** 30
FUSED = ("fused_attention", "chunked_loss")
LABELS = {"fused_attention": "fused attention", "chunked_loss": "chunked loss"}


def apply_fused(g: Graph, kinds: Sequence[str]) -> tuple[Graph, list[int], list[str]]:
    """g with the first site of each rule of `kinds` (of WITH_FUSED) applied in turn, in
    capture order: the graph, its order, and what each applied (its site's description)."""
    h, order, done = g, list(g.order), []
    for kind in kinds:
        rule = WITH_FUSED.rewrite_rule(kind)
        site = next(iter(rule.sites(Query(h, order))), None)
        if site is None:
            continue
        rw: Rewrite = rule.apply(h, order, site)
        h, order = rw.graph, list(rw.order)
        done.append(f"{LABELS[kind]}: {site.description}")
    return h, order, done


def _paper(names: Sequence[str], size: str, batch_size: int | None, search: bool) -> None:
    from peakcut.workloads import get_workload
    cost = get_cost_model("h100")
    print("| workload | substitution | applied | peak before | peak after | latency before | latency after |")
    print("|---|---|---|---|---|---|---|")
    searches = []
    for name in names:
        start = time.perf_counter()
        inst = get_workload(name).build(size, batch_size=batch_size)
        g = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
        before = simulate(g, list(g.order)).peak_bytes
        t0 = simulate_timeline(g, list(g.order), cost).latency_seconds
        for kinds in (FUSED[:1], FUSED[1:], FUSED):
            h, order, done = apply_fused(g, kinds)
            label = " + ".join(LABELS[k] for k in kinds)
            if not done:
                print(f"| {inst.description} | {label} | nothing | - | - | - | - |")
                continue
            after = simulate(h, order).peak_bytes
            t1 = simulate_timeline(h, order, cost).latency_seconds
            print(f"| {inst.description} | {label} | {'; '.join(done)} | {before / GIB:.1f} GiB | "
                  f"{after / GIB:.1f} GiB ({after / before:.0%}) | {t0:.3f} s | {t1:.3f} s |")
        print(f"<!-- {name}: {time.perf_counter() - start:.0f} s, capture included (measured) -->")
        if search:
            searches.append((inst.description, g, before, t0))
    if searches:
        _search(searches)


def _registries() -> dict[str, Registry]:
    attention = Registry(regions=WITH_FUSED.regions, programs=WITH_FUSED.programs,
                         rewrites=tuple(r for r in WITH_FUSED.rewrites if r.kind != "chunked_loss"))
    return {"RULES": RULES, "RULES + fused attention": attention, "WITH_FUSED": WITH_FUSED}


def _search(steps: Sequence[tuple[str, Graph, int, float]]) -> None:
    from peakcut.optimizer import optimize_graph
    regs = _registries()
    print()
    print("| workload | " + " | ".join(f"`{k}`" if " " not in k else k for k in regs) + " |")
    print("|---|" + "---|" * len(regs))
    for description, g, before, t0 in steps:
        cells = []
        for reg in regs.values():
            start = time.perf_counter()
            found = optimize_graph(g, latency_limit=1.1, device="h100", max_states=40, time_budget=math.inf, rules=reg)
            best = found.best
            fused = [a for a in best.applied if a.startswith(("fused", "chunked"))]
            cells.append(f"peak {best.peak_bytes / before:.1%}, latency x{best.latency_s / t0:.3f}"
                         + (f" ({'; '.join(fused)})" if fused else "")
                         + f" <!-- {time.perf_counter() - start:.0f} s -->")
        print(f"| {description} | " + " | ".join(cells) + " |")


def _check(names: Sequence[str]) -> None:
    from peakcut.codegen.program import Step
    from peakcut.runtime.equivalence import rounding_tolerance
    from peakcut.workloads import get_workload
    adamw = peakcut.AdamW(lr=1e-3, weight_decay=0.01)
    for name in names:
        inst = get_workload(name).build("tiny")
        g = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, adamw, keep_grads=True))
        h, order, done = apply_fused(g, FUSED)
        tol = rounding_tolerance(torch.float32, inst.batch[0].shape[1], 3)
        report = peakcut.check_equivalence(inst.model, inst.batch, inst.loss_fn, adamw,
                                           lambda _m, h=h, order=order: Step(h, order), steps=3, rtol=tol, atol=tol)
        print(f"{inst.description}: {'; '.join(done)}: {report}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["gpt-neo-1.3b", "btlm-3b"])
    parser.add_argument("--size", default="paper")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--search", action="store_true", help="also search with RULES, attention and WITH_FUSED")
    parser.add_argument("--check", action="store_true", help="tiny size: the numbers against eager over 3 steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.check:
        _check(args.workloads)
        return
    _paper(args.workloads, args.size, args.batch_size, args.search)


if __name__ == "__main__":
    main()
