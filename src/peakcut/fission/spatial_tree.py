"""The F-Tree of the rows: Algorithm 1 over the regions spatial fission can split.

    tree = find_spatial_ftree(g)                    # FTree, every node disabled
    r = split_spatial(g, order, tree.with_n(k, 2))  # a Rewrite: the enabled nodes split
    best = best_spatial_root(g, tree, n=2)          # (root, simulated peak), or None

The batch F-Tree (build.py) follows a D-Graph label through every op. Rows cannot be followed
that way: a convolution's output rows read a window of its input rows (a halo), which no axis
label says. So the rows' "D-Graph" here is built from what peakcut.transform.spatial can split
(`why_not_node`): convolutions (forward and backward, 2-D, not transposed), element-wise ops
on [N, C, H, W] images, softmax along the channels, detaches and a per-pixel loss, joined where
one reads the other's image along its rows (an element-wise op's same-height inputs, a
convolution's input, a backward's grad_output and input, a loss's scores). A convolution's
backward ends a component: its gradients are added up over the parts, never read inside a
region; a pointwise one's grad_input joins its readers (its rows are exact). Each connected
component is a ComponentView; its length is the gcd of its images' heights, so every divisor
of it is a valid number of parts.

Algorithm 1 (peakcut.fission.analyzer) then picks regions as for the batch: memory hot-spots of
the simulated step, dominator subtrees of each component, the score intervals; plus the op at
the peak alone, when it is in a component (a convolution's backward often is the hot-spot
itself). A candidate is trimmed of the ends that only make it hand on whole images
(`trimmed`), then kept if split_rows accepts it at n = 2 (its convex core otherwise).

Enabling an F-Tree node is split_rows on its region (halos recomputed, the program written out
per part); nested enabled nodes are not supported: split_spatial refuses them, naming both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import replace

import rustworkx as rx

from peakcut.fission.analyzer import DEFAULT_LEVELS, ComponentView, ftree_from_components
from peakcut.fission.build import memory_view
from peakcut.fission.ftree import FNode, FTree
from peakcut.fission.trans import convex_core
from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.memory import simulate
from peakcut.memory.workspace import WorkspaceSpec
from peakcut.transform.rewrite import Rewrite, RuleError, compose_rewrites
from peakcut.transform.spatial import (
    CONV,
    CONV_BACKWARD,
    NLL_BACKWARD,
    NLL_FORWARD,
    ROW_LOCAL_VIEWS,
    ROWS,
    is_pointwise,
    split_inputs,
    split_rows,
    why_not_node,
    why_not_split_rows,
)

LABEL = "rows"


def _row_inputs(g: Graph, v: int) -> list[int]:
    """The tensors node v reads along its rows (v can be in a spatial region)."""
    node = g.nodes[v]
    if node.op in (CONV, CONV_BACKWARD):
        images = node.args[:2] if node.op == CONV_BACKWARD else node.args[:1]
        return [a.id for a in images if isinstance(a, TensorRef)]
    if node.op in (NLL_FORWARD, NLL_BACKWARD):
        scores = node.args[1 if node.op == NLL_BACKWARD else 0]
        return [scores.id] if isinstance(scores, TensorRef) else []
    split = split_inputs(g, node)
    return split if isinstance(split, list) else []


def _row_edges(g: Graph, members: set[int]) -> Iterator[tuple[int, int]]:
    """(producer, reader) pairs of members joined along the rows."""
    for v in members:
        for t in _row_inputs(g, v):
            u = g.producer(t)
            if u is None or u not in members:
                continue
            back = g.nodes[u]
            if back.op != CONV_BACKWARD or (t == back.outputs[0] and is_pointwise(g, back)):
                yield u, v


def _heights(g: Graph, nodes: Sequence[int]) -> list[int]:
    """The rows of every image the nodes make or read along their rows (of a convolution's
    backward: its grad_output, input and grad_input, not its weight's gradient)."""
    out = []
    for v in nodes:
        node = g.nodes[v]
        made = node.outputs[:1] if node.op == CONV_BACKWARD else node.output_ids()
        for t in (*(t for t in made if t is not None), *_row_inputs(g, v)):
            shape = g.tensors[t].shape
            if len(shape) == 4:
                out.append(shape[ROWS])
    return out


def rows_components(g: Graph) -> list[ComponentView]:
    """The connected pieces of the ops spatial fission can split, joined along their rows
    (module doc), as Algorithm 1's component views (label "rows", length: the gcd of their
    images' heights; a region's own
    length is the gcd of its own images', find_spatial_ftree)."""
    members = {v for v in g.order if why_not_node(g, v) is None}
    graph = rx.PyGraph()
    index = {v: graph.add_node(v) for v in members}
    preds: dict[int, list[int]] = {v: [] for v in members}
    for u, v in _row_edges(g, members):
        graph.add_edge(index[u], index[v], None)
        preds[v].append(u)
    position = {v: i for i, v in enumerate(g.order)}
    views = []
    pieces = sorted((sorted((graph[i] for i in piece), key=position.__getitem__)
                     for piece in rx.connected_components(graph)), key=lambda nodes: position[nodes[0]])
    for k, nodes in enumerate(pieces):
        length = math.gcd(*_heights(g, nodes)) or 1
        views.append(ComponentView(tuple(nodes), {v: tuple(preds[v]) for v in nodes},
                                   dict.fromkeys(nodes, LABEL), length, k))
    return views


def find_spatial_ftree(g: Graph, order: Sequence[int] | None = None, levels: int = DEFAULT_LEVELS,
                       workspace: WorkspaceSpec = "auto") -> FTree:
    """Algorithm 1 over the rows' components (module doc), hot-spots from the simulated step
    under `workspace`; every node disabled."""
    order = list(g.order if order is None else order)
    views = rows_components(g)
    profile = simulate(g, order, workspace)
    mem = memory_view(g, order, profile)

    def valid(region: frozenset[int], view: ComponentView) -> frozenset[int] | None:
        region = trimmed(g, region)
        if why_not_split_rows(g, order, sorted(region), 2) is None:
            return region
        core = convex_core(g, region)
        core = trimmed(g, core) if core else core
        return core if core and why_not_split_rows(g, order, sorted(core), 2) is None else None

    peak = profile.peak_node if order else None
    extra = ([] if peak is None else
             [(frozenset({peak}), view, peak) for view in views if peak in view.labels])
    tree = ftree_from_components(views, mem, levels, valid=valid, extra=extra)
    return _with_region_lengths(g, tree)


def trimmed(g: Graph, region: frozenset[int]) -> frozenset[int]:
    """The region without the element-wise ends that only make it hand on more: a node no
    region node reads, whose output the region would hand on whole (preallocated before the
    parts), is left to run after the parts when every tensor it reads from the region is
    handed on anyway (an end that would make the region hand on its input instead stays: run
    whole after the parts it would hold input and output at once). A view (a detach) leaves the region
    when nothing in it reads the view (a view is not handed on) or when it views a tensor made
    outside (its readers in the region then slice the view itself). Algorithm 1's candidates are
    dominator subtrees, which run on past the op at the peak into what the step reads next
    (a batch norm's backward after U-Net's last convolution backward: `x - mean` and
    `dy * (x - mean)`, two whole images handed on for nothing)."""
    kept = set(region)
    position = {v: i for i, v in enumerate(g.order)}
    while True:
        for v in sorted(kept, key=lambda u: -position[u]):
            if _trimmable(g, v, kept):
                kept.discard(v)
                break
        else:
            return frozenset(kept)


def _trimmable(g: Graph, v: int, region: set[int]) -> bool:
    """Whether region node v is an end the region is better without (trimmed)."""
    node = g.nodes[v]
    if node.op in (CONV, CONV_BACKWARD, NLL_FORWARD, NLL_BACKWARD):
        return False
    outs = node.output_ids()
    read_inside = any(u in region for t in outs for u in g.users(t))
    if node.op in ROW_LOCAL_VIEWS:     # a view is never handed on; one of an outside tensor splits as well there
        return not read_inside or all(g.producer(t) not in region for t in node.input_ids())
    if read_inside:
        return False
    return not any(g.producer(t) in region and t not in g.outputs and all(r == v or r in region for r in g.users(t))
                   for t in node.input_ids())


def _with_region_lengths(g: Graph, tree: FTree) -> FTree:
    """The tree with each node's length the gcd of its own region's heights (a component's
    deepest layers can be 1 row high where its other regions are not), nodes of length 1
    dropped, ids and parents renumbered."""
    kept = []
    for f in tree.nodes:
        length = math.gcd(*_heights(g, sorted(f.nodes))) or 1
        if length > 1:
            kept.append(replace(f, length=length))
    nodes = [replace(f, id=k, parent=None) for k, f in enumerate(kept)]
    return FTree(tuple(
        replace(f, parent=next((p.id for p in sorted(nodes, key=lambda p: len(p.nodes)) if f.nodes < p.nodes),
                               None))
        for f in nodes))


def why_not_split_spatial(tree: FTree) -> str | None:
    """Why the enabled nodes of `tree` cannot be split together (None: they can)."""
    enabled = tree.enabled()
    for a in enabled:
        for b in enabled:
            if a.id < b.id and a.nodes & b.nodes:
                return (f"spatial F-Tree nodes {a.id} and {b.id} are both enabled and overlap: "
                        "overlapping (or nested) spatial regions are not split together")
    return None


def split_spatial(g: Graph, order: Sequence[int], tree: FTree) -> Rewrite:
    """Every enabled node of the spatial F-Tree run in its n parts along the rows (split_rows,
    one region after the other). Raises RuleError naming what does not apply."""
    reason = why_not_split_spatial(tree)
    if reason:
        raise RuleError(reason)
    enabled: list[FNode] = tree.enabled()
    if not enabled:
        raise RuleError("no spatial F-Tree node is enabled")
    steps: list[Rewrite] = []
    h, seq = g, list(order)
    for f in enabled:
        r = split_rows(h, seq, sorted(f.nodes), f.n)
        steps.append(r)
        h, seq = r.graph, list(r.order)
    if len(steps) == 1:
        return steps[0]
    return compose_rewrites(g, steps, "; ".join(s.description for s in steps))


def best_spatial_root(g: Graph, tree: FTree, n: int, order: Sequence[int] | None = None,
                      workspace: WorkspaceSpec = "auto") -> tuple[int, int] | None:
    """(root, simulated peak) of the root that, enabled alone at `n` parts, gives the lowest
    peak; None when no root splits at `n` (its length has no such divisor, or split_rows
    refuses it in `order`)."""
    order = list(g.order if order is None else order)
    best: tuple[int, int] | None = None
    for root in tree.roots():
        if tree.nodes[root].length % n:
            continue
        try:
            r = split_spatial(g, order, tree.with_n(root, n))
        except RuleError:
            continue
        peak = simulate(r.graph, r.order, workspace).peak_bytes
        if best is None or peak < best[1]:
            best = (root, peak)
    return best
