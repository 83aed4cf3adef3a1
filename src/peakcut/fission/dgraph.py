"""The dimension graph (D-Graph, MAGIS §4.1) of a captured step.

Vertices are <node, label>: one per axis label of a node's dimension rule
(peakcut.ir.dims), spatial (in an output) or reduce (only in inputs). For
every tensor a node reads from another node, the labels at the same tensor
dimension on both sides are joined. Connected components are the graph-level
dimensions a sub-graph can be split along.

Lengths. A label may sit on a dimension that merges it with others (the
batch inside a flattened batch x sequence dimension): splitting that label
in n cuts every dimension carrying it into n contiguous equal slices. A
component's length is the gcd of every length its labels carry
(peakcut.ir.dims.label_sizes; label_lengths gives their gcd per label). A
fission number n must divide it, so every dimension of the component is cut
evenly.
Nodes without a rule (opaque, random, unprovable) have no vertices and are
never split.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from peakcut.ir.dims import DimRule, dim_rule
from peakcut.ir.dims.split import label_lengths
from peakcut.ir.graph import Graph

Vertex = tuple[int, str]  # (node id, axis label)


@dataclass(frozen=True)
class Component:
    """One graph-level dimension: the vertices it joins and the length every part divides."""

    id: int
    vertices: frozenset[Vertex]
    length: int
    labels: dict[int, tuple[str, ...]] = field(repr=False)  # node -> its labels in this component

    @property
    def nodes(self) -> frozenset[int]:
        return frozenset(self.labels)


@dataclass(frozen=True)
class DGraph:
    """Rules per node, the D-Graph's edges and its components."""

    rules: dict[int, DimRule]
    edges: frozenset[tuple[Vertex, Vertex]]
    components: tuple[Component, ...]
    component_of: dict[Vertex, int]
    _node_edges: dict[int, frozenset[tuple[int, int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def node_edges(self, component: Component) -> frozenset[tuple[int, int]]:
        """(producer, reader) node pairs of the edges inside `component`.

        Grouped for every component in one pass over the edges, the first time a
        component of this D-Graph is asked for; any other Component is filtered afresh.
        """
        if not (0 <= component.id < len(self.components)
                and self.components[component.id] is component):
            return frozenset((a[0], b[0]) for a, b in self.edges
                             if a in component.vertices and b in component.vertices)
        if not self._node_edges:
            grouped: dict[int, set[tuple[int, int]]] = {}
            component_of = self.component_of
            for a, b in self.edges:   # both ends of an edge lie in one component
                grouped.setdefault(component_of[a], set()).add((a[0], b[0]))
            self._node_edges.update({k: frozenset(e) for k, e in grouped.items()})
        return self._node_edges.get(component.id, frozenset())

    def component_at(self, node: int, label: str) -> Component | None:
        k = self.component_of.get((node, label))
        return self.components[k] if k is not None else None

    def linked(self, u: int, v: int, component: Component) -> bool:
        """True when some edge of the component joins nodes u and v."""
        pairs = self.node_edges(component)
        return (u, v) in pairs or (v, u) in pairs


def build_dgraph(g: Graph, nodes: Iterable[int] | None = None) -> DGraph:
    """The D-Graph of `g` (or of the sub-graph induced by `nodes`).

    Rules and label lengths are cached per node object (dim_rule, label_lengths):
    a graph that shares most Node objects with one analysed before rebuilds only
    its edges and components.
    """
    members = list(g.order if nodes is None else nodes)
    rules = {nid: r for nid in members if (r := dim_rule(g, nid)) is not None}
    parent: dict[Vertex, Vertex] = {}
    lengths: dict[Vertex, int] = {}
    for nid, rule in rules.items():
        for label, length in label_lengths(g, nid, rule).items():
            if length > 1:
                v = (nid, label)
                parent[v] = v
                lengths[v] = length

    def find(v: Vertex) -> Vertex:
        root = v
        while (up := parent[root]) != root:
            root = up
        while (up := parent[v]) != root:
            parent[v] = root
            v = up
        return root

    edges: set[tuple[Vertex, Vertex]] = set()
    graph_nodes = g.nodes
    producer = g.producer_map()
    for nid, rule in rules.items():
        for t, dims in zip(graph_nodes[nid].input_tuple, rule.inputs, strict=False):
            u = producer.get(t)
            if u is None:
                continue
            rule_u = rules.get(u)   # only members have rules
            if rule_u is None:
                continue
            k = graph_nodes[u].outputs.index(t)
            for lab_v, lab_u in zip(dims, rule_u.outputs[k], strict=False):
                if lab_u is None or lab_v is None:
                    continue
                a, b = (u, lab_u), (nid, lab_v)
                if a not in lengths or b not in lengths:
                    continue
                edges.add((a, b))
                ra, rb = find(a), find(b)
                if ra != rb:
                    parent[ra] = rb
    groups: dict[Vertex, list[Vertex]] = {}
    for v in lengths:
        root = find(v)
        found = groups.get(root)
        if found is None:
            groups[root] = [v]
        else:
            found.append(v)
    components = []
    component_of: dict[Vertex, int] = {}
    for k, verts in enumerate(sorted(groups.values(), key=lambda vs: (-len(vs), min(vs)))):
        labels: dict[int, list[str]] = {}
        length = 0
        for v in verts:
            nid, lab = v
            found_labels = labels.get(nid)
            if found_labels is None:
                labels[nid] = [lab]
            else:
                found_labels.append(lab)
            component_of[v] = k
            length = math.gcd(length, lengths[v])
        components.append(Component(k, frozenset(verts), length,
                                    {nid: tuple(sorted(labs)) for nid, labs in labels.items()}))
    return DGraph(rules, frozenset(edges), tuple(components), component_of)
