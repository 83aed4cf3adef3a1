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
(peakcut.ir.dims.label_sizes). A fission number n must divide it, so every
dimension of the component is cut evenly.
Nodes without a rule (opaque, random, unprovable) have no vertices and are
never split.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from peakcut.ir.dims import DimRule, dim_rule, label_sizes
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


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Vertex, Vertex] = {}

    def add(self, v: Vertex) -> None:
        self.parent.setdefault(v, v)

    def find(self, v: Vertex) -> Vertex:
        root = v
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[v] != root:
            self.parent[v], v = root, self.parent[v]
        return root

    def union(self, a: Vertex, b: Vertex) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb


@dataclass(frozen=True)
class DGraph:
    """Rules per node, the D-Graph's edges and its components."""

    rules: dict[int, DimRule]
    edges: frozenset[tuple[Vertex, Vertex]]
    components: tuple[Component, ...]
    component_of: dict[Vertex, int]

    def component_at(self, node: int, label: str) -> Component | None:
        k = self.component_of.get((node, label))
        return self.components[k] if k is not None else None

    def linked(self, u: int, v: int, component: Component) -> bool:
        """True when some edge of the component joins nodes u and v."""
        return any((a[0], b[0]) in ((u, v), (v, u)) for a, b in self.edges
                   if a in component.vertices and b in component.vertices)


def build_dgraph(g: Graph, nodes: Iterable[int] | None = None) -> DGraph:
    """The D-Graph of `g` (or of the sub-graph induced by `nodes`)."""
    members = list(g.order if nodes is None else nodes)
    inside = set(members)
    rules = {nid: r for nid in members if (r := dim_rule(g, nid)) is not None}
    uf = _UnionFind()
    lengths: dict[Vertex, int] = {}
    for nid, rule in rules.items():
        for label, sizes in label_sizes(g, nid, rule).items():
            length = math.gcd(*sizes) if sizes else 0
            if length > 1:
                uf.add((nid, label))
                lengths[(nid, label)] = length
    edges: set[tuple[Vertex, Vertex]] = set()
    for nid, rule in rules.items():
        node = g.nodes[nid]
        for t, dims in zip(node.input_ids(), rule.inputs, strict=False):
            u = g.producer(t)
            if u is None or u not in inside or u not in rules:
                continue
            k = g.nodes[u].outputs.index(t)
            for lab_v, lab_u in zip(dims, rules[u].outputs[k], strict=False):
                a, b = (u, lab_u), (nid, lab_v)
                if lab_u is None or lab_v is None or a not in lengths or b not in lengths:
                    continue
                edges.add((a, b))
                uf.union(a, b)
    groups: dict[Vertex, list[Vertex]] = {}
    for v in lengths:
        groups.setdefault(uf.find(v), []).append(v)
    components = []
    component_of: dict[Vertex, int] = {}
    for k, verts in enumerate(sorted(groups.values(), key=lambda vs: (-len(vs), min(vs)))):
        labels: dict[int, list[str]] = {}
        for nid, lab in verts:
            labels.setdefault(nid, []).append(lab)
            component_of[(nid, lab)] = k
        length = 0
        for v in verts:
            length = math.gcd(length, lengths[v])
        components.append(Component(k, frozenset(verts), length,
                                    {nid: tuple(sorted(labs)) for nid, labs in labels.items()}))
    return DGraph(rules, frozenset(edges), tuple(components), component_of)
