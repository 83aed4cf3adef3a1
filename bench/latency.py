"""Predicted vs measured step latency on this CPU, and the ranking of plans of different latency.

    python -m bench.latency > bench/latency.md

For every tiny workload (AdamW step):

- predicted: the timeline simulator (peakcut.simulate) with the *measured*
  CPU cost model (every distinct op timed on this machine, cached on disk);
- measured: wall time of the generated program on this CPU
  (peakcut.measure, median of `REPEATS` runs after a warm-up).

Five plans per workload differ in latency: plan r recomputes every
re-computable op for its later readers r times over (r = 0..4: round k
recomputes the copy made by round k-1, so each round adds one real op per
option). For each workload the ranking of the five plans by predicted
latency is compared with the ranking by measured latency on 5 pairs (the 4
neighbours, plan r vs r+1, and the extremes, plan 0 vs 4) and on all 10
pairs.
"""

from __future__ import annotations

import itertools
import platform
import statistics

import torch

import peakcut
from peakcut import Graph
from peakcut.cost import MeasuredCostModel
from peakcut.simulate import simulate_timeline
from peakcut.transform import remat, why_not_remat
from peakcut.workloads import WORKLOAD_NAMES, get_workload

REPEATS = 11
ROUNDS = (0, 1, 2, 3, 4)


def remat_plans(g: Graph) -> list[tuple[Graph, list[int]]]:
    """Plan r: every re-computable op recomputed r times over for its later readers."""
    order = list(g.order)
    pos = {nid: i for i, nid in enumerate(order)}
    options: list[tuple[int, tuple[int, ...]]] = []
    for nid in order:
        outs = g.nodes[nid].output_ids()
        if not outs:
            continue
        readers = sorted({u for t in outs for u in g.users(t)}, key=pos.__getitem__)
        if len(readers) >= 2 and why_not_remat(g, order, nid, readers[1:]) is None:
            options.append((nid, tuple(readers[1:])))
    plans = [(g, order)]
    h, o = g, order
    for _ in ROUNDS[1:]:
        nxt = []
        for nid, users in options:
            if why_not_remat(h, o, nid, users) is None:
                rw = remat(h, o, nid, users)
                h, o = rw.graph, rw.order
                nxt.append((rw.added[0], users))
        options = nxt
        plans.append((h, o))
    return plans


def concordant(pred: list[float], meas: list[float], pairs) -> int:
    return sum((pred[a] - pred[b]) * (meas[a] - meas[b]) > 0 for a, b in pairs)


def main() -> None:
    print(f"Environment: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, peakcut {peakcut.__version__}.\n")
    print("Predicted = timeline simulator with the measured CPU cost model; measured = generated "
          f"program on this CPU, median of {REPEATS} runs.\n")
    rows = ["| workload | plan (remat rounds) | ops | predicted ms | measured ms | predicted/measured |",
            "|---|---|---|---|---|---|"]
    rank_rows = ["| workload | 5 pairs (neighbours + extremes) in order | all 10 pairs in order |",
                 "|---|---|---|"]
    errors = []
    neighbours_ok = all_ok = 0
    for name in WORKLOAD_NAMES:
        inst = get_workload(name).build("tiny")
        g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        cost = MeasuredCostModel()
        plans = remat_plans(g)
        pred, meas = [], []
        for k, (h, order) in zip(ROUNDS, plans, strict=True):
            cost.profile(h)
            p = simulate_timeline(h, order, cost).latency_seconds
            step = peakcut.Step(h, order)
            m = peakcut.measure(step, inst.model, inst.batch, repeats=REPEATS).seconds
            pred.append(p)
            meas.append(m)
            errors.append(p / m - 1)
            rows.append(f"| {name} | {k} | {len(h.nodes)} | {p * 1e3:.2f} | {m * 1e3:.2f} | {p / m:.3f} |")
        cost.save()
        n_ok = concordant(pred, meas, [(i, i + 1) for i in range(len(pred) - 1)] + [(0, len(pred) - 1)])
        a_ok = concordant(pred, meas, list(itertools.combinations(range(len(pred)), 2)))
        neighbours_ok += n_ok
        all_ok += a_ok
        rank_rows.append(f"| {name} | {n_ok}/5 | {a_ok}/10 |")
    print("\n".join(rows))
    print("\n" + "\n".join(rank_rows))
    worst = max(abs(e) for e in errors)
    print(f"\nAll plans: |predicted/measured - 1| mean {statistics.mean(abs(e) for e in errors):.1%}, "
          f"worst {worst:.1%}. Ranking: 5-pair sets {neighbours_ok}/{5 * len(WORKLOAD_NAMES)}, "
          f"all pairs {all_ok}/{10 * len(WORKLOAD_NAMES)}.")


if __name__ == "__main__":
    main()
