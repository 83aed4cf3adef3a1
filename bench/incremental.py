"""Incremental vs full rescheduling on random NASNet-like networks (MAGIS §7.3, Fig. 14).

    python -m bench.incremental > bench/incremental.md

10 random NASNet-like networks (peakcut.workloads.nasnet, inference graphs,
16 cells), each scheduled once in full; then 10 rounds per network of one
random local transformation (re-materialize or swap a tensor for its later
readers, or undo an earlier one). After each, the new graph is scheduled
twice:

- full (FS): narrow-waist partition of the whole graph + DP per segment
  (greedy for segments over the DP's size limit), from the capture order;
- incremental (IS, Algorithm 2): only the interval around the change,
  chosen from the previous order's narrow-waist values, partitioned and
  DP-scheduled, spliced into the previous order.

Both times include building the scheduling problem of the new graph. The
narrow-waist values IS uses are those of the previous graphs (new nodes get
none, so they are never chosen as boundaries); they are not recomputed per
round. Peaks are simulated (spine memory model). "Same peak" counts rounds
where IS's peak is no higher than FS's (IS lower than FS is counted and
reported apart: FS is exact only within segments).
"""

from __future__ import annotations

import random
import statistics
import time

import peakcut
from peakcut import Graph
from peakcut.ir.ops import LOAD_OP
from peakcut.ir.tags import RematTag
from peakcut.schedule import (
    IntervalSettings,
    IntervalStats,
    Problem,
    Reachability,
    incremental_schedule,
    schedule_interval,
)
from peakcut.transform import (
    Rewrite,
    deremat,
    deswap,
    remat,
    swap,
    why_not_deremat,
    why_not_deswap,
    why_not_remat,
    why_not_swap,
)
from peakcut.workloads import random_nasnet

NETWORKS = 10
ROUNDS = 10
SETTINGS = IntervalSettings(dp_max_nodes=60, dp_max_states=4096, dp_seconds=2.0)


def full_schedule(g: Graph) -> tuple[list[int], int]:
    problem = Problem(g)
    order = schedule_interval(problem, problem.eager_order(), 0, problem.n, SETTINGS, IntervalStats())
    return problem.node_ids(order), problem.peak(order)


def narrow_waist(g: Graph, order: list[int]) -> dict[int, int]:
    h = g.with_order(order)
    problem = Problem(h)
    nw = Reachability(problem).narrow_waist()
    return {problem.ids[v]: value for v, value in nw.items()}


def random_change(g: Graph, order: list[int], rng: random.Random) -> Rewrite | None:
    """One random applicable local transformation, or None if the draw found none."""
    undo = [n for n in order if (g.nodes[n].tags.get(RematTag) is not None and why_not_deremat(g, order, n) is None)
            or (g.nodes[n].op == LOAD_OP and why_not_deswap(g, order, n) is None)]
    if undo and rng.random() < 0.2:
        nid = rng.choice(undo)
        return deremat(g, order, nid) if g.nodes[nid].tags.get(RematTag) is not None else deswap(g, order, nid)
    pos = {nid: i for i, nid in enumerate(order)}
    for _ in range(50):
        nid = rng.choice(order)
        outs = g.nodes[nid].output_ids()
        if not outs:
            continue
        tensor = outs[0]
        readers = sorted(set(g.users(tensor)), key=pos.__getitem__)
        if len(readers) < 2:
            continue
        later = tuple(readers[len(readers) // 2:])
        if rng.random() < 0.5:
            if why_not_remat(g, order, nid, later) is None:
                return remat(g, order, nid, later)
        elif why_not_swap(g, order, tensor, later) is None:
            return swap(g, order, tensor, later)
    return None


def main() -> None:
    rows = ["| net | round | nodes | change | FS ms | IS ms | speed-up | FS peak | IS peak | interval |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    speedups: list[float] = []
    same = better = fallbacks = 0
    for net in range(NETWORKS):
        rng = random.Random(1000 + net)
        model, x = random_nasnet(net, cells=16)
        g = peakcut.capture(model, x)
        order, _ = full_schedule(g)
        nw = narrow_waist(g, order)
        for rnd in range(ROUNDS):
            change = None
            while change is None:
                change = random_change(g, order, rng)
            new = change.graph
            t0 = time.perf_counter()
            _, fs_peak = full_schedule(_ordered(new, change.order))
            fs = time.perf_counter() - t0
            touched = set(change.changed) | set(change.removed)
            t0 = time.perf_counter()
            result = incremental_schedule(order, nw, _ordered(new, change.order), touched, change.added,
                                          settings=SETTINGS)
            inc = time.perf_counter() - t0
            speedups.append(fs / inc)
            same += result.peak_bytes <= fs_peak
            better += result.peak_bytes < fs_peak
            fallbacks += bool(result.fell_back)
            lo, hi = result.interval
            rows.append(f"| {net} | {rnd} | {len(new.nodes)} | {change.description[:60]} | {fs * 1e3:.1f} | "
                        f"{inc * 1e3:.1f} | {fs / inc:.1f}x | {fs_peak:,} | {result.peak_bytes:,} | "
                        f"{hi - lo} nodes{' (full: ' + result.fell_back + ')' if result.fell_back else ''} |")
            g, order = new, result.order
            for a in change.added:
                nw.setdefault(a, len(order))
    total = NETWORKS * ROUNDS
    print("Simulated peaks; wall times on this machine (one process, warm).\n")
    print("\n".join(rows))
    print(f"\nSpeed-up: mean {statistics.mean(speedups):.1f}x, median {statistics.median(speedups):.1f}x, "
          f"min {min(speedups):.1f}x, max {max(speedups):.1f}x. IS peak <= FS peak in {same}/{total} "
          f"(lower in {better}); full-schedule fallbacks {fallbacks}.\n")
    print(f"incremental: speedup {statistics.mean(speedups):.1f}x, same peak {same}/{total}")


def _ordered(g: Graph, order: list[int]) -> Graph:
    h = g.with_order(order)
    return h


if __name__ == "__main__":
    main()
