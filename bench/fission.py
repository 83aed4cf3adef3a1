"""F-Tree of the batch dimension on the paper-size workloads, and the root enabled at n = 2.

    python -m bench.fission > bench/fission.md

Per workload (AdamW step, captured over FakeTensors): time to build the
D-Graph and the F-Tree (Algorithm 1, L = 4) of the batch dimension's
components, its levels and nodes per level, and the simulated peak when the
F-Tree's root runs in 2 parts (in a forest, one root per stretch of the batch
dimension, the root that lowers it most), against the eager peak; and the batch-fission bound (peakcut.fission.bound): the peak no exact
split along the batch goes below, whatever the F-Tree, with the node where
it is reached.
The loss's gradient seed and target count are first computed without the loss
(peakcut.fission.loss, exact), so that regions may span forward and backward.
A workload with training-mode batch norms gets a second row, "batch norms split": the same
on the step with every batch norm rewritten as batch-splittable ops
(peakcut.transform.batch_norm; its eager peak is that step's in capture order).
A second table: spatial fission (peakcut.transform.spatial, the split_rows rule) of the
convolutions nearest the peak (the rule's sites: the convolutions, forward or backward, with
the most bytes live while they run), each alone at n = 2, 4 and 8: the simulated peak of the
captured step with that one node split, against eager's.
All peaks are simulated (capture order, CPU workspace model); nothing runs.
"""

from __future__ import annotations

import platform
import time

import torch

import peakcut
from peakcut.fission import batch_fission_bound, best_root_at_two, find_ftree
from peakcut.fission.loss import detach_loss
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.rules import RULES
from peakcut.transform.batch_norm import split_batch_norms_everywhere
from peakcut.workloads import WORKLOAD_NAMES, get_workload


def _gib(n: int) -> str:
    return f"{n / 2**30:.3f}"


def _row(description: str, g: Graph, eager: int) -> str:
    """One table row: the F-Tree of g's batch dimension (capture order), its best root at
    n = 2, the bound; changes against `eager` (the captured step's peak)."""
    base = simulate(g).peak_bytes
    t0 = time.perf_counter()
    tree, dgraph = find_ftree(g, batch_only=True)
    build_s = time.perf_counter() - t0
    bound = batch_fission_bound(g, dgraph)
    at = g.nodes[bound.node] if bound.node is not None else None
    where = f"{at.op.removeprefix('aten.').removesuffix('.default')} {at.module}" if at else "-"
    bound_cell = f"{_gib(bound.bytes)} ({bound.bytes / eager - 1:+.2%}, {where})"
    if not tree.nodes:
        return (f"| {description} | {len(g.nodes)} | {build_s:.1f} | 0 | - | - | {_gib(base)} | - | - | - "
                f"| {bound_cell} |")
    t0 = time.perf_counter()
    best = best_root_at_two(g, tree, dgraph)
    expand_s = time.perf_counter() - t0
    if best is None:
        return (f"| {description} | {len(g.nodes)} | {build_s:.1f} | {tree.levels()} | {tree.nodes_per_level()} "
                f"| - | {_gib(base)} | no root of even length | - | {expand_s:.1f} | {bound_cell} |")
    root, peak = best
    return (f"| {description} | {len(g.nodes)} | {build_s:.1f} | {tree.levels()} | "
            f"{tree.nodes_per_level()} | {len(tree.nodes[root].nodes)} | {_gib(base)} | {_gib(peak)} | "
            f"{peak / eager - 1:+.1%} | {expand_s:.1f} | {bound_cell} |")


def _spatial_rows(description: str, g: Graph) -> list[str]:
    """Rows of the spatial table: each split_rows site of g (capture order) and its peak."""
    eager = simulate(g)
    rule = RULES.rewrite_rule("split_rows")
    at = g.nodes[eager.peak_node]
    peak_at = f"{at.op.removeprefix('aten.').removesuffix('.default')} {at.module}"
    by_node: dict[int, dict[int, int]] = {}
    for site in rule.sites(g, g.order):
        r = rule.apply(g, g.order, site)
        by_node.setdefault(site.nodes[0], {})[site.parts[0]] = simulate(r.graph, r.order).peak_bytes
    rows = []
    for v, peaks in by_node.items():
        node = g.nodes[v]
        cells = " | ".join(f"{_gib(peaks[n])} ({peaks[n] / eager.peak_bytes - 1:+.1%})" if n in peaks else "-"
                           for n in (2, 4, 8))
        rows.append(f"| {description} | {_gib(eager.peak_bytes)} ({peak_at}) | {node.name} "
                    f"{node.op.removeprefix('aten.').removesuffix('.default')} {node.module} | {cells} |")
    return rows or [f"| {description} | {_gib(eager.peak_bytes)} ({peak_at}) | no 2-D convolution | - | - | - |"]


def main() -> None:
    print(f"Environment: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, peakcut {peakcut.__version__}. Peaks simulated.\n")
    rows = ["| workload | ops | F-Tree s | levels | nodes per level | root region ops | eager peak GiB | "
            "root n=2 peak GiB | change | expand s (all roots) | batch-fission bound GiB (vs eager, at) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    spatial = ["| workload | eager peak GiB (at) | node split | n=2 | n=4 | n=8 |", "|---|---|---|---|---|---|"]
    for name in WORKLOAD_NAMES:
        inst = get_workload(name).build("paper")
        captured = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        g = detach_loss(captured)                       # a copy: `captured` stays as captured
        rows.append(_row(inst.description, g, simulate(g).peak_bytes))
        split = split_batch_norms_everywhere(g)
        if split is not None:
            rows.append(_row(f"{inst.description}, batch norms split", split.graph, simulate(g).peak_bytes))
        if any(n.op == "aten.convolution.default" for n in captured.nodes.values()):
            spatial += _spatial_rows(inst.description, captured)
    print("\n".join(rows))
    print("\nSpatial fission (split_rows) of one convolution near the peak, simulated peak (vs eager):\n")
    print("\n".join(spatial))


if __name__ == "__main__":
    main()
