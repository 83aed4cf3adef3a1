"""The F-Trees of the batch and of the rows on the paper-size workloads, roots enabled alone.

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
A second table: the F-Tree of the rows (peakcut.fission.spatial_tree: Algorithm 1 over the
ops spatial fission splits, joined along their rows; a region splits with halos, split_rows)
of the three CNNs, on the same step with the loss detached (a region may then span the
per-pixel loss of a segmentation network, forward and backward): as captured, with the batch
norms split (regions then span a normalize, its ReLU and the next convolution, or U-Net's last
normalize through the loss to the ReLU's backward), and with the convolution backward at the peak run as two
calls (split_conv_grads, as the optimizer's polish does: the input-gradient call's parts then
read a shape-only view of the input). Per step: the rows' components, the tree's build time,
levels, nodes per level, the step's own peak, and the root that lowers the peak most when
enabled alone at n = 2, 4 and 8 (its simulated peak against the captured step's).
All peaks are simulated (capture order, CPU workspace model); nothing runs.
"""

from __future__ import annotations

import platform
import time

import torch

import peakcut
from peakcut.fission import batch_fission_bound, best_root_at_two, find_ftree
from peakcut.fission.loss import detach_loss
from peakcut.fission.spatial_tree import best_spatial_root, find_spatial_ftree, rows_components
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.transform.batch_norm import split_batch_norms_everywhere
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.taso.conv_grads import split_conv_grads, why_not_split_conv_grads
from peakcut.workloads import WORKLOAD_NAMES, get_workload

SPATIAL_WORKLOADS = ("resnet50", "unet", "unetpp")     # the CNNs


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


def _op(g: Graph, v: int) -> str:
    node = g.nodes[v]
    return f"{node.op.removeprefix('aten.').removesuffix('.default')} {node.module}"


def _spatial_row(description: str, g: Graph, eager: int, order: list[int] | None = None) -> str:
    """One row of the spatial table: the rows' F-Tree of g (in `order`, capture order by
    default) and its best root at n = 2, 4 and 8; changes against `eager` (the captured
    step's peak)."""
    order = list(g.order if order is None else order)
    base = simulate(g, order)
    t0 = time.perf_counter()
    tree = find_spatial_ftree(g, order)
    build_s = time.perf_counter() - t0
    components = len(rows_components(g))
    head = (f"| {description} | {components} | {build_s:.1f} | {tree.levels()} | {tree.nodes_per_level()} "
            f"| {_gib(base.peak_bytes)} ({_op(g, base.peak_node)}) |")
    if not tree.nodes:
        return head + " - | - | - |"
    cells = []
    for n in (2, 4, 8):
        best = best_spatial_root(g, tree, n, order)
        if best is None:
            cells.append("-")
            continue
        root, peak = best
        ops = sorted(tree.nodes[root].nodes, key=order.index)
        what = _op(g, ops[0]) if len(ops) == 1 else f"{len(ops)} ops from {_op(g, ops[0])}"
        cells.append(f"{_gib(peak)} ({peak / eager - 1:+.2%}; {what})")
    return head + " " + " | ".join(cells) + " |"


def _grads_split_at_peak(g: Graph) -> Rewrite | None:
    """g with the convolution backward at its simulated peak run as two calls
    (split_conv_grads), as the optimizer's polish does; None where the peak is elsewhere."""
    peak = simulate(g).peak_node
    if peak is None or why_not_split_conv_grads(g, g.order, peak) is not None:
        return None
    return split_conv_grads(g, g.order, [peak])


def main() -> None:
    print(f"Environment: torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, peakcut {peakcut.__version__}. Peaks simulated.\n")
    rows = ["| workload | ops | F-Tree s | levels | nodes per level | root region ops | eager peak GiB | "
            "root n=2 peak GiB | change | expand s (all roots) | batch-fission bound GiB (vs eager, at) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    spatial = ["| step | rows components | F-Tree s | levels | nodes per level | its peak GiB (at) | "
               "best root at n=2 GiB (vs eager) | at n=4 | at n=8 |", "|---|---|---|---|---|---|---|---|---|"]
    for name in WORKLOAD_NAMES:
        inst = get_workload(name).build("paper")
        captured = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
        g = detach_loss(captured)                       # a copy: `captured` stays as captured
        rows.append(_row(inst.description, g, simulate(g).peak_bytes))
        split = split_batch_norms_everywhere(g)
        if split is not None:
            rows.append(_row(f"{inst.description}, batch norms split", split.graph, simulate(g).peak_bytes))
        if name in SPATIAL_WORKLOADS:
            eager = simulate(g).peak_bytes
            spatial.append(_spatial_row(inst.description, g, eager))
            if split is not None:
                spatial.append(_spatial_row(f"{inst.description}, batch norms split", split.graph, eager))
            grads = _grads_split_at_peak(g)
            if grads is not None:
                spatial.append(_spatial_row(f"{inst.description}, the backward at the peak as two calls",
                                            grads.graph, eager, list(grads.order)))
    print("\n".join(rows))
    print("\nThe F-Tree of the rows (spatial fission, split_rows), simulated peak (vs the captured step's):\n")
    print("\n".join(spatial))


if __name__ == "__main__":
    main()
