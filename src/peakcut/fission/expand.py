"""The plain graph a fissioned step runs: every enabled F-Tree node unrolled into its n parts.

`expand(g, order, tree, dgraph)` returns an ordinary IR graph (Expanded.graph) and a
topological order of it (Expanded.order) that do exactly what the generated fission loops do,
so that memory and latency of a fissioned step are those of an ordinary graph, with part
shapes, slices, copies and accumulations all visible (docs/fission.md, "Fissioned graphs",
says in full what a region expands to). Regions expand one after the other on a private copy
of the graph (peakcut.fission.region): roots first, nested enabled F-Tree nodes inside each
part of their parent, with the original nodes' dimension rules; once every region is
expanded, the parts' matrix products add into the summed outputs they make
(peakcut.fission.accumulate). Enabled regions must nest or be disjoint; anything that
cannot be proven exact is refused with a FissionError naming the node or tensor.

compact=True (what the optimizer evaluates fission states on) builds part 0 of every region
only, plus keep-alive aliases of its inputs: its simulated peak is the full expansion's, its
latency the full one's when a node is priced once per part of every region around it
(peakcut.optimizer.compact); it does not compute the step.

Speed (an optimizer calls expand per candidate): FakeTensor runs are memoized by op, arguments
and input layouts (`memo`, shared across expansions), snapshots after each region let an
expansion start where a similar one left off (`reuse`, peakcut.fission.reuse), and the final
check runs its shape check once per distinct call; check=False skips it.

    ex = expand(g, order, tree, dgraph)
    memory.simulate(ex.graph, ex.order).peak_bytes              # memory of the fissioned step
    simulate_timeline(ex.graph, ex.order, cost).latency_seconds  # its latency
    Step(ex.graph, ex.order)                                    # its program, with loops
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch._subclasses.fake_tensor import FakeTensorMode

from peakcut.fission.dgraph import DGraph
from peakcut.fission.expanded import Expanded, FissionError
from peakcut.fission.ftree import FNode, FTree
from peakcut.fission.region import RegionExpander
from peakcut.fission.reuse import ExpansionCache, ExpansionStep
from peakcut.ir.check import _check_node_shapes, check_graph
from peakcut.ir.graph import Graph
from peakcut.ir.infer import LayoutMemo, Unhashable, encode
from peakcut.ir.node import Node
from peakcut.ir.tags import Path
from peakcut.transform.rewrite import describe_node


def expand(g: Graph, order: Sequence[int], tree: FTree, dgraph: DGraph, *,
           check: bool = True, compact: bool = False,
           memo: LayoutMemo | None = None,
           reuse: ExpansionCache | None = None) -> Expanded:
    """The unrolled graph of every enabled F-Tree node (see module doc); g is not modified.

    check: validate the expanded graph as Graph.check does (raising GraphError); a caller that
    trusts g and the expansion may skip it.
    compact: build part 0 of every region only, for evaluation (see "Compact expansion" in
    the module doc); the result is not a program.
    memo: the FakeTensor-run memo to use (share one across expansions of graphs of the same
    device; its entries are pure functions of their keys).
    reuse: snapshots to start from and add to (peakcut.fission.reuse); the result is the same
    as without.
    """
    order = list(order)
    if len(order) != len(g.nodes) or g.nodes.keys() != set(order):
        raise FissionError(f"the order has {len(order)} nodes, the graph {len(g.nodes)} "
                           "(not a permutation of the graph's nodes)")
    enabled = tree.enabled()
    children, roots = _nesting(g, enabled, dgraph)
    by_id = {f.id: f for f in enabled}
    start = None
    if reuse is not None:
        start = reuse.longest(g, order, dgraph, compact, _planned_steps(by_id, children, roots, compact))
    expander = RegionExpander(g, order, dgraph.rules, compact, memo) if start is None else \
        RegionExpander.resumed(start, compact, memo)
    taken: list[ExpansionStep] = [] if start is None else list(start.steps)
    taken_parts: list[tuple[dict[int, int], ...]] = [] if start is None else list(start.parts)
    position = 0

    def split(f: FNode, current: Mapping[int, int], path: Path) -> None:
        nonlocal position
        here = [v for v in f.nodes if v in current]
        if not here:
            return
        step = _step(f, path)
        if position < len(taken):      # taken by the snapshot this expansion started from
            if taken[position] != step:
                raise RuntimeError(f"expansion snapshot out of step at F-Tree node {f.id}: "
                                   "a region expanded differently from the same graph")
            parts: Sequence[Mapping[int, int]] = taken_parts[position]
        else:
            parts = expander.region(frozenset(current[v] for v in here),
                                    {current[v]: f.labels[v] for v in here}, f.n, f.id, path,
                                    f.component)
            if reuse is not None:
                taken.append(step)
                taken_parts.append(tuple(parts))
                reuse.save(g, order, dgraph, compact, expander.snapshot(tuple(taken), tuple(taken_parts)),
                           tuple(enabled))
        position += 1
        for k, part in enumerate(parts):
            # views the parts do not need were not copied (they run whole after the parts)
            inner = {v: part[current[v]] for v in here if current[v] in part}
            for child in children[f.id]:
                split(by_id[child], inner, (*path, (f.id, k)))

    for root in roots:
        split(by_id[root], {v: v for v in by_id[root].nodes}, ())
    expander.fuse_accumulations()
    expanded = expander.result()
    if check:
        _check(expanded.graph)
    return expanded


def _step(f: FNode, path: Path) -> ExpansionStep:
    """What decides the expansion of region f inside `path` (peakcut.fission.reuse)."""
    return ExpansionStep(f.id, f.n, path, f.nodes, id(f.labels), f.component)


def _planned_steps(by_id: Mapping[int, FNode], children: Mapping[int, list[int]], roots: list[int],
                   compact: bool) -> list[ExpansionStep]:
    """The regions expand() expands, in its order (a region whose nodes no part copied is
    skipped there, which only makes the snapshot lookup miss)."""
    steps: list[ExpansionStep] = []

    def walk(f: FNode, path: Path) -> None:
        steps.append(_step(f, path))
        for k in range(1 if compact else f.n):
            for child in children[f.id]:
                walk(by_id[child], (*path, (f.id, k)))

    for root in roots:
        walk(by_id[root], ())
    return steps


def _nesting(g: Graph, enabled: Sequence[FNode],
             dgraph: DGraph) -> tuple[dict[int, list[int]], list[int]]:
    """Direct children of each enabled F-Tree node among the enabled ones, and the roots.

    Enabled regions must be nested or disjoint; a child's parent is the smallest enabled
    region strictly containing it.
    """
    for f in enabled:
        unknown = [v for v in f.nodes if v not in g.nodes]
        if unknown:
            raise FissionError(f"F-Tree node {f.id} holds node {unknown[0]}, which the graph lacks")
        if set(f.labels) != set(f.nodes):
            raise FissionError(f"F-Tree node {f.id}: its labels do not cover exactly its nodes")
        ruleless = [v for v in f.nodes if v not in dgraph.rules]
        if ruleless:
            raise FissionError(f"F-Tree node {f.id}: {describe_node(g, ruleless[0])} has no dimension rule")
    children: dict[int, list[int]] = {f.id: [] for f in enabled}
    roots: list[int] = []
    for f in sorted(enabled, key=lambda x: (len(x.nodes), x.id)):
        holders = []
        for h in enabled:
            if h.id == f.id or not (h.nodes & f.nodes):
                continue
            if f.nodes < h.nodes:
                holders.append(h)
            elif not h.nodes < f.nodes:
                raise FissionError(f"enabled F-Tree nodes {f.id} and {h.id} overlap without "
                                   "nesting (or cover the same nodes)")
        if holders:
            children[min(holders, key=lambda h: len(h.nodes)).id].append(f.id)
        else:
            roots.append(f.id)
    return children, roots


def _check(g: Graph) -> None:
    """Graph.check, with the shape check run once per distinct call.

    check_graph re-runs every node on FakeTensors of its inputs and compares the outputs'
    shapes and dtypes with the graph's; the parts of a region and repeated layers make the
    same call on the same input layouts with the same expected outputs, and such a call passes
    or fails alike. Nodes are visited in order as check_graph does, so the first failing node
    (and its message) is the same.
    """
    check_graph(g, infer_shapes=False)
    passed: set[tuple[Any, ...]] = set()
    with FakeTensorMode(allow_non_fake_inputs=False):
        for nid in g.order:
            if g.is_opaque(nid):
                continue
            key = _check_key(g, g.nodes[nid])
            if key is not None and key in passed:
                continue
            _check_node_shapes(g, nid)
            if key is not None:
                passed.add(key)


def _check_key(g: Graph, node: Node) -> tuple[Any, ...] | None:
    """What check_graph's shape check of `node` depends on: the op, its arguments (tensors as
    input positions), its inputs' shapes, strides and dtypes, and its outputs' shapes and
    dtypes; None if an argument cannot be keyed exactly."""
    inputs = node.input_ids()
    position = {t: i for i, t in enumerate(inputs)}
    try:
        args = encode(node.args, position)
        kwargs = encode(node.kwargs, position)
    except Unhashable:
        return None
    layouts = tuple((m.shape, m.stride, m.dtype) for m in (g.tensors[t] for t in inputs))
    outputs = tuple(None if t is None else (g.tensors[t].shape, g.tensors[t].dtype)
                    for t in node.outputs)
    return node.op, args, kwargs, layouts, outputs
