"""F-Trans f = (S, D, n) and its validity (MAGIS §4.2), plus the conditions our code generation needs.

An F-Trans splits the nodes S along D-Graph component D into n parts (an F-Tree node holds one).

The paper's conditions:
1. G[S] is weakly connected;
2. G[S] is convex: no path leaves S and comes back;
3. no redundant computation: every node of S carries exactly one label of D,
   and every edge inside S is an edge of D.

peakcut adds what the split program needs to be exact:
4. n divides D's length;
5. no node of S writes a storage that S does not allocate (an in-place write
   to an outside tensor would be cut into parts that each see a partial state);
6. every tensor S hands to the rest of the graph (or to the caller) lives in a
   storage its producer allocates (or is a pure view of such a tensor: the view
   runs again on the merged base), and is rebuilt from the parts in a way
   peakcut.fission.expand supports: concatenated along D, summed, averaged,
   an NLL mean, or the same in every part.
"""

from __future__ import annotations

from collections.abc import Iterable

import rustworkx as rx

from peakcut.fission.dgraph import Component, DGraph
from peakcut.ir.graph import Graph
from peakcut.ir.registry import OpKind, lookup


def pure_view(g: Graph, nid: int) -> bool:
    """A view op that writes nothing: running it again on a merged base gives the merged view."""
    info = lookup(g.nodes[nid].op)
    return info is not None and info.kind is OpKind.VIEW and not g.mutated_tensors(nid)


def trim_views(g: Graph, nodes: Iterable[int]) -> frozenset[int]:
    """S without the view nodes whose results are only read outside S (repeatedly).

    A view costs no memory, so running it after the parts are merged, on the
    whole tensor, loses nothing, and the tensor S hands out is then the base
    its producer allocates, which the split program can merge into.
    """
    S = set(nodes)
    outs = set(g.outputs)
    changed = True
    while changed:
        changed = False
        for v in sorted(S):
            info = lookup(g.nodes[v].op)
            if info is None or info.kind is not OpKind.VIEW:
                continue
            results = g.nodes[v].output_ids()
            if all(t not in outs and all(u not in S for u in g.users(t)) for t in results):
                S.discard(v)
                changed = True
    return frozenset(S)


def convex_core(g: Graph, nodes: Iterable[int]) -> frozenset[int]:
    """The largest weakly connected piece of S minus every node a path leaving S comes back to.

    Removing the nodes downstream of an outside node that S reaches leaves a
    convex set (a path between two kept nodes through an outside or removed
    node would have removed its end), and each weakly connected piece of a
    convex set is convex. A dominator subtree that spans a batch norm (its
    forward stretch, then the backward stretch that reads the same saved
    activations) keeps its forward stretch this way.
    """
    S = frozenset(nodes)
    position = {nid: i for i, nid in enumerate(g.order)}
    last = max((position[v] for v in S), default=-1)
    tainted: set[int] = set()
    frontier = [w for v in S for w in g.successors(v) if w not in S]
    while frontier:
        w = frontier.pop()
        if w in tainted or position[w] > last:
            continue
        tainted.add(w)
        frontier.extend(g.successors(w))
    core = S - tainted
    if not core:
        return core
    pieces = rx.PyGraph()
    index = {v: pieces.add_node(v) for v in core}
    for v in core:
        for p in g.predecessors(v):
            if p in core:
                pieces.add_edge(index[p], index[v], None)
    best = max(rx.connected_components(pieces), key=lambda c: (len(c), -min(pieces[i] for i in c)))
    return frozenset(pieces[i] for i in best)


def boundary_outputs(g: Graph, nodes: frozenset[int]) -> list[int]:
    """Tensors produced in S and read outside it or returned by the program."""
    outs = set(g.outputs)
    found = []
    for nid in nodes:
        for t in g.nodes[nid].output_ids():
            if t in outs or any(u not in nodes for u in g.users(t)):
                found.append(t)
    return sorted(found)


def why_not_valid(g: Graph, dgraph: DGraph, nodes: Iterable[int], component: Component,
                  n: int = 2) -> str | None:
    """The first condition (see module doc) that f = (S, D, n) breaks, or None when valid."""
    S = frozenset(nodes)
    if not S:
        return "S is empty"
    missing = [v for v in S if v not in component.labels]
    if missing:
        return f"node {g.nodes[missing[0]].name} does not carry dimension {component.id}"
    double = [v for v in S if len(component.labels[v]) != 1]
    if double:
        return f"node {g.nodes[double[0]].name} carries dimension {component.id} twice"
    if component.length % n:
        return f"n = {n} does not divide the dimension's length {component.length}"
    # 1. weakly connected, 3. every inner edge is a D-edge
    inner = rx.PyGraph()
    index = {v: inner.add_node(v) for v in S}
    d_edges = dgraph.node_edges(component)
    for v in S:
        for p in g.predecessors(v):
            if p in S:
                if (p, v) not in d_edges and p not in g.control.get(v, ()):
                    return (f"edge {g.nodes[p].name} -> {g.nodes[v].name} does not follow "
                            f"dimension {component.id} (redundant computation)")
                inner.add_edge(index[p], index[v], None)
    if not rx.is_connected(inner):
        return "S is not weakly connected"
    # 2. convex: nothing outside S is both reachable from S and reaching S
    if _leaves_and_returns(g, S):
        return "S is not convex: a path leaves it and comes back"
    # 5. no in-place writes to outside storages
    allocated = {g.tensors[t].storage for v in S for t in g.nodes[v].output_ids()
                 if not any(g.tensors[i].storage == g.tensors[t].storage for i in g.nodes[v].input_ids())}
    for v in S:
        for t in g.mutated_tensors(v):
            if g.tensors[t].storage not in allocated:
                return f"node {g.nodes[v].name} writes {g.tensors[t].name}, which S does not allocate"
    # 6. outputs: a fresh storage or a pure view of one (the view runs again on the merged
    #    base), and a way to rebuild them from the parts
    for t in boundary_outputs(g, S):
        made_by = g.producer(t)
        if made_by is None:   # never: a node of S outputs it
            continue
        rule = dgraph.rules[made_by]
        label = component.labels[made_by][0]
        aliases = any(g.tensors[i].storage == g.tensors[t].storage for i in g.nodes[made_by].input_ids())
        if aliases and not pure_view(g, made_by):
            return f"output {g.tensors[t].name} of S is an in-place result"
        how = rule.combine(label)[g.nodes[made_by].outputs.index(t)]
        if how not in MERGEABLE:
            return (f"output {g.tensors[t].name} of S cannot be rebuilt from its parts "
                    f"(merge {how!r} along dimension {component.id})")
    return None


MERGEABLE = frozenset({"cat", "same", "sum", "mean", "nll_mean"})  # what fission.expand rebuilds


def _leaves_and_returns(g: Graph, S: frozenset[int]) -> bool:
    """True when a node outside S is reachable from S and reaches S."""
    frontier = [u for v in S for u in g.successors(v) if u not in S]
    seen = set(frontier)
    while frontier:
        u = frontier.pop()
        for w in g.successors(u):
            if w in S:
                return True
            if w not in seen:
                seen.add(w)
                frontier.append(w)
    return False
