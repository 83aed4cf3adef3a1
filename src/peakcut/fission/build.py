"""The F-Tree of a captured step: memory hot-spots + D-Graph components -> Algorithm 1.

    tree, dgraph = analyze(g)                    # all components worth splitting
    tree, dgraph = analyze(g, batch_only=True)   # only the batch dimension's component
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.fission.analyzer import DEFAULT_LEVELS, ComponentView, MemoryView, build_ftree
from peakcut.fission.dgraph import Component, DGraph, build_dgraph
from peakcut.fission.ftree import FTree
from peakcut.fission.trans import trim_views, why_not_valid
from peakcut.ir.graph import Graph
from peakcut.ir.tensor import Role

MIN_COMPONENT_NODES = 8  # smaller components are not worth a fission candidate


def memory_view(g: Graph, order: Sequence[int] | None = None) -> MemoryView:
    """Allocations, reads and hot-spots (storages live at the simulated peak) of `order`."""
    order = list(g.order if order is None else order)
    profile = g.simulate(order)
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


def batch_component(g: Graph, dgraph: DGraph) -> tuple[Component, set[int]] | None:
    """The component holding dimension 0 of the first batch input (the data input), and the
    nodes that read that input (what "the batch dimension" means)."""
    batch = [t for t, name in zip(g.inputs, g.input_names, strict=True)
             if name.startswith("batch:") and g.tensors[t].role is Role.INPUT and g.tensors[t].shape]
    for t in batch:
        for user in g.users(t):
            rule = dgraph.rules.get(user)
            if rule is None:
                continue
            labels = rule.inputs[g.nodes[user].input_ids().index(t)]
            if labels and labels[0] is not None:
                comp = dgraph.component_at(user, labels[0])
                if comp is not None:
                    return comp, {u for u in g.users(t) if u in comp.labels}
    return None


def analyze(g: Graph, order: Sequence[int] | None = None, levels: int = DEFAULT_LEVELS,
            batch_only: bool = False) -> tuple[FTree, DGraph]:
    """Algorithm 1 over the graph's D-Graph components (or only the batch one)."""
    dgraph = build_dgraph(g)
    if batch_only:
        found = batch_component(g, dgraph)
        comps = [found] if found is not None else []
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
        trimmed = trim_views(g, region)
        return trimmed if why_not_valid(g, dgraph, trimmed, by_view[id(view)]) is None else None

    return build_ftree(views, memory_view(g, order), levels, valid=valid), dgraph
