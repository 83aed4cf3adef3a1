"""The F-Tree of a captured step: memory hot-spots + D-Graph components -> Algorithm 1.

    tree, dgraph = find_ftree(g)                    # all components worth splitting
    tree, dgraph = find_ftree(g, batch_only=True)   # only the batch dimension's components

(peakcut.fission.analyzer.ftree_from_components is Algorithm 1 itself, on component views.)
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

from peakcut.fission.analyzer import (
    DEFAULT_LEVELS,
    ComponentView,
    MemoryView,
    dominator_tree,
    ftree_from_components,
)
from peakcut.fission.dgraph import Component, DGraph, build_dgraph
from peakcut.fission.expand import expand
from peakcut.fission.ftree import FTree
from peakcut.fission.head import head_candidates
from peakcut.fission.trans import convex_core, trim_views, why_not_valid
from peakcut.ir.graph import Graph
from peakcut.ir.tensor import Role
from peakcut.memory import MemoryProfile, simulate
from peakcut.memory.workspace import WorkspaceSpec

MIN_COMPONENT_NODES = 8  # smaller components are not worth a fission candidate


def memory_view(g: Graph, order: Sequence[int] | None = None,
                profile: MemoryProfile | None = None) -> MemoryView:
    """Allocations, reads and hot-spots (storages live at the simulated peak) of `order`.

    profile: simulate(g, order), when the caller has it already.
    """
    order = list(g.order if order is None else order)
    if profile is None:
        profile = simulate(g, order)
    allocs: dict[int, dict[int, int]] = {}
    for s, (first, _) in profile.storage_lifetime.items():
        if first >= 0:
            allocs.setdefault(order[first], {})[s] = g.storages[s]
    reads = {nid: frozenset(g.tensors[t].storage for t in g.nodes[nid].input_ids()) for nid in order}
    hot = frozenset(s for s, (a, f) in profile.storage_lifetime.items() if a <= profile.peak_index <= f)
    return MemoryView(allocs, reads, hot, dict(g.storages))


def component_view(g: Graph, comp: Component, sources: set[int] | None = None) -> ComponentView:
    """G' of Algorithm 1 for one component; with `sources`, only what they reach inside it.

    The dominator tree is rooted at the data input (§4.3, footnote 3): other
    inputs (an attention mask, the labels) enter regions as side inputs, the
    way weights do, instead of cutting every dominator path at the root.
    """
    members = set(comp.labels)
    if sources is not None:
        reached = {v for v in sources if v in members}
        frontier = list(reached)
        while frontier:
            u = frontier.pop()
            for t in g.nodes[u].output_ids():
                for w in g.users(t):
                    if w in members and w not in reached:
                        reached.add(w)
                        frontier.append(w)
        members = reached
    nodes = tuple(nid for nid in g.order if nid in members)
    inside = set(nodes)
    preds = {nid: tuple(p for p in g.predecessors(nid) if p in inside) for nid in nodes}
    return ComponentView(nodes, preds, {nid: comp.labels[nid][0] for nid in nodes}, comp.length, comp.id)


# Ops that compute statistics over the batch: the batch dimension runs through
# them (output 0 and the same-shaped inputs), but they can never be split along it.
BATCH_STATISTICS = frozenset({
    "aten.native_batch_norm.default",
    "aten._native_batch_norm_legit.default",
    "aten._native_batch_norm_legit_functional.default",
    "aten.native_batch_norm_backward.default",
})


def _batch_inputs(g: Graph) -> list[int]:
    return [t for t, name in zip(g.inputs, g.input_names, strict=True)
            if name.startswith("batch:") and g.tensors[t].role is Role.INPUT and g.tensors[t].shape]


def _dim0_components(g: Graph, dgraph: DGraph, t: int) -> list[Component]:
    """The components at dim 0 of tensor t, at every node that reads or writes it with a label there."""
    found = []
    p = g.producer(t)
    ends = [(u, dgraph.rules.get(u), "in", g.nodes[u].input_ids().index(t)) for u in g.users(t)]
    if p is not None:
        ends.append((p, dgraph.rules.get(p), "out", g.nodes[p].outputs.index(t)))
    for node, rule, side, k in ends:
        if rule is None:
            continue
        dims = (rule.inputs if side == "in" else rule.outputs)[k]
        if dims and dims[0] is not None and (comp := dgraph.component_at(node, dims[0])) is not None:
            found.append(comp)
    return found


def batch_components(g: Graph, dgraph: DGraph) -> list[tuple[Component, set[int] | None]]:
    """The D-Graph components that carry the batch dimension, with their source nodes.

    The batch dimension starts at dim 0 of the batch inputs (the data and the
    labels) and is followed through every component, and through the ops in
    BATCH_STATISTICS that cut it (training-mode batch norm and its backward:
    a CNN's batch dimension is one component per stretch between two batch
    norms). The data input's component keeps only the nodes its readers reach
    (what "the batch dimension" means there); other components count whole.
    """
    comps: dict[int, tuple[Component, set[int] | None]] = {}
    seen: set[int] = set()
    queue = deque(_batch_inputs(g))  # the data input first: its component gets the sources
    data = queue[0] if queue else None
    while queue:
        t = queue.popleft()
        if t in seen:
            continue
        seen.add(t)
        for comp in _dim0_components(g, dgraph, t):
            if comp.id in comps:
                continue
            sources = {u for u in g.users(t) if u in comp.labels} if t == data else None
            comps[comp.id] = (comp, sources)
            queue.extend(_dim0_tensors(g, dgraph, comp))
        for node in (*g.users(t), *([p] if (p := g.producer(t)) is not None else [])):
            queue.extend(_through_statistics(g, node))
    return sorted(comps.values(), key=lambda cs: cs[0].id)


def _dim0_tensors(g: Graph, dgraph: DGraph, comp: Component) -> list[int]:
    """Tensors whose dim 0 carries `comp` at some node of it."""
    out = []
    for nid, labels in comp.labels.items():
        rule = dgraph.rules[nid]
        node = g.nodes[nid]
        for t, dims in (*zip(node.input_ids(), rule.inputs, strict=False),
                        *zip(node.outputs, rule.outputs, strict=False)):
            if t is not None and dims and dims[0] in labels:
                out.append(t)
    return out


def _through_statistics(g: Graph, nid: int) -> list[int]:
    """For a batch-statistics op: its output 0 and the inputs of the same shape."""
    node = g.nodes[nid]
    first = node.outputs[0] if node.outputs else None
    if node.op not in BATCH_STATISTICS or first is None:
        return []
    shape = g.tensors[first].shape
    return [first, *(t for t in node.input_ids() if g.tensors[t].shape == shape)]


def batch_component(g: Graph, dgraph: DGraph) -> tuple[Component, set[int]] | None:
    """The component holding dimension 0 of the data input, and the nodes that read it."""
    for comp, sources in batch_components(g, dgraph):
        if sources is not None:
            return comp, sources
    return None


def find_ftree(g: Graph, order: Sequence[int] | None = None, levels: int = DEFAULT_LEVELS,
               batch_only: bool = False, workspace: WorkspaceSpec = "auto") -> tuple[FTree, DGraph]:
    """Algorithm 1 over the graph's D-Graph components (or only the batch one); the memory
    hot-spots are those of the simulated step under `workspace` (the search's model)."""
    dgraph = build_dgraph(g)
    if batch_only:
        comps = batch_components(g, dgraph)
    else:
        comps = [(c, None) for c in dgraph.components
                 if len(c.labels) >= MIN_COMPONENT_NODES and c.length > 1]
    by_view = {}
    views = []
    for comp, sources in comps:
        view = component_view(g, comp, sources)
        by_view[id(view)] = comp
        views.append(view)

    def valid(region: frozenset[int], view: ComponentView) -> frozenset[int] | None:
        trimmed = trim_views(g, convex_core(g, region))
        return trimmed if why_not_valid(g, dgraph, trimmed, by_view[id(view)]) is None else None

    profile = simulate(g, list(g.order if order is None else order), workspace)
    mem = memory_view(g, order, profile)
    extra = _peak_candidates(g, order, views, profile)
    nested = head_candidates(g, views)
    return ftree_from_components(views, mem, levels, valid=valid, extra=extra, nested=nested), dgraph


def random_ftree(g: Graph, order: Sequence[int] | None = None, seed: int = 0, count: int = 8,
                 batch_only: bool = True) -> tuple[FTree, DGraph]:
    """A "naive fission" F-Tree (MAGIS §7.2.5 ablation): `count` valid regions picked at
    random (dominator subtrees of random nodes of the components), no heat or score."""
    rng = random.Random(seed)
    dgraph = build_dgraph(g)
    comps = batch_components(g, dgraph) if batch_only else [
        (c, None) for c in dgraph.components if len(c.labels) >= MIN_COMPONENT_NODES and c.length > 1]
    views = [component_view(g, comp, sources) for comp, sources in comps]
    by_view = {id(v): comp for v, (comp, _) in zip(views, comps, strict=True)}
    picks: list[tuple[frozenset[int], ComponentView, int]] = []
    for _ in range(8 * count):
        if len(picks) >= count or not views:
            break
        view = rng.choice(views)
        idom = dominator_tree(view)
        v = rng.choice(view.nodes)
        below = {u for u in view.nodes if _dominated_by(idom, u, v)} - {v}
        region = trim_views(g, convex_core(g, below)) if below else frozenset()
        if region and why_not_valid(g, dgraph, region, by_view[id(view)]) is None:
            picks.append((region, view, v))

    def keep(region: frozenset[int], view: ComponentView) -> frozenset[int] | None:
        return region

    tree = ftree_from_components([], memory_view(g, order), valid=keep, extra=picks)
    return tree, dgraph


def _dominated_by(idom: dict[int, int | None], node: int, v: int) -> bool:
    u: int | None = node
    while u is not None:
        if u == v:
            return True
        u = idom.get(u)
    return False


def best_root_at_two(g: Graph, tree: FTree, dgraph: DGraph, order: Sequence[int] | None = None,
                     workspace: WorkspaceSpec = "auto") -> tuple[int, int] | None:
    """(root, simulated peak under `workspace`) of the F-Tree root that, enabled alone at
    n = 2, gives the lowest simulated peak (a forest has one root per component or more);
    None if empty."""
    order = list(g.order if order is None else order)
    best: tuple[int, int] | None = None
    for root in tree.roots():
        if tree.nodes[root].length % 2:
            continue
        split = expand(g, order, tree.with_n(root, 2), dgraph)
        peak = simulate(split.graph, split.order, workspace).peak_bytes
        if best is None or peak < best[1]:
            best = (root, peak)
    return best


def _peak_candidates(g: Graph, order: Sequence[int] | None, views: list[ComponentView],
                     profile: MemoryProfile | None = None,
                     ) -> list[tuple[frozenset[int], ComponentView, int]]:
    """The op running at the peak, alone, when a component carries it (beyond Algorithm 1).

    Dominator subtrees are built from what the step keeps alive; the op at the
    peak can be the hot-spot itself (a convolution's backward: its whole-size
    gradient and workspace), with every subtree around it crossing a batch norm.
    Split alone, only its own working set shrinks; the F-Tree still holds it
    only when it is a valid F-Trans.
    """
    order = list(g.order if order is None else order)
    if profile is None and order:
        profile = simulate(g, order)
    if not order or profile is None:
        return []
    peak = order[profile.peak_index]
    return [(frozenset({peak}), view, peak) for view in views if peak in view.labels]
