"""F-Tree of the batch dimension on the paper-size workloads, and the root enabled at n = 2.

    python -m bench.fission > bench/fission.md

Per workload (AdamW step, captured over FakeTensors): time to build the
D-Graph and the F-Tree (Algorithm 1, L = 4) of the batch dimension's
component, its levels and nodes per level, and the simulated peak when the
F-Tree's root (the largest region) runs in 2 parts, against the eager peak.
The loss's gradient seed and target count are first computed without the loss
(peakcut.fission.loss, exact), so that regions may span forward and backward.
All peaks are simulated (capture order, CPU workspace model); nothing runs.
"""

from __future__ import annotations

import platform
import time

import torch

import peakcut
from peakcut.fission.build import analyze
from peakcut.fission.expand import expand
from peakcut.fission.loss import detach_loss
from peakcut.workloads import WORKLOAD_NAMES, get_workload


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f}"


def main() -> None:
    print(f"Environment: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, peakcut {peakcut.__version__}. Peaks simulated.\n")
    rows = ["| workload | ops | F-Tree s | levels | nodes per level | root region ops | eager peak GiB | "
            "root n=2 peak GiB | change | expand s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in WORKLOAD_NAMES:
        inst = get_workload(name).build("paper")
        g = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
        eager = g.simulate().peak_bytes
        t0 = time.perf_counter()
        tree, dgraph = analyze(g, batch_only=True)
        build_s = time.perf_counter() - t0
        if not tree.nodes:
            rows.append(f"| {inst.description} | {len(g.nodes)} | {build_s:.1f} | 0 | - | - | {_gib(eager)} | - | - | - |")
            continue
        root = max(tree.roots(), key=lambda k: len(tree.nodes[k].nodes))
        t0 = time.perf_counter()
        ex = expand(g, list(g.order), tree.with_n(root, 2), dgraph)
        peak = ex.graph.simulate(ex.order).peak_bytes
        expand_s = time.perf_counter() - t0
        rows.append(f"| {inst.description} | {len(g.nodes)} | {build_s:.1f} | {tree.levels()} | "
                    f"{tree.nodes_per_level()} | {len(tree.nodes[root].nodes)} | {_gib(eager)} | {_gib(peak)} | "
                    f"{peak / eager - 1:+.1%} | {expand_s:.1f} |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
