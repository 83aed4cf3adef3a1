"""Algorithm 1 of MAGIS (M-Analyzer): F-Tree construction from memory hot-spots and dominators.

For each D-Graph component D (ComponentView: the graph nodes that carry D,
their edges, per node the label of D, and D's length):

1. the dominator tree T of G' (the sub-graph induced by D), rooted at a
   virtual root above G's entry nodes: the data input (§4.3, footnote 3);
2. heat(v) = bytes of the hot-spot storages allocated inside T.des(v) (Eq. 3);
3. score(v) = (1 - 1/n) heat(v) - bytes of the storages S reads but does not
   allocate and that are not hot-spots, with S = T.des(v) minus v (Eq. 4).
   These are the inputs that stay resident while the n parts run. The paper
   writes G.inps(T.des(v)). The region actually split is S, whose inputs
   include v's own output, so S's inputs are counted;
4. with s_max the largest score: for i = 1..L, V_i = {v : i/L <= s/s_max < (i+1)/L};
   from each V_i the nodes with no T-descendant in V_i become dominators of
   candidates S = T.des(v) minus v (lines 9-15), kept if the F-Trans is valid.

Candidates nest (dominator subtrees are nested or disjoint): a candidate's
parent in the F-Tree is the smallest other candidate containing it.

Speed: subtrees are contiguous ranges of a DFS order of T; the input term is
computed only for nodes whose heat could still reach the lowest interval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import rustworkx as rx

from peakcut.fission.ftree import FNode, FTree

DEFAULT_LEVELS = 4  # L (MAGIS default)


@dataclass(frozen=True)
class ComponentView:
    """One D-Graph component as Algorithm 1 sees it."""

    nodes: tuple[int, ...]                  # graph node ids of G', in a topological order
    preds: Mapping[int, tuple[int, ...]]    # predecessors within G'
    labels: Mapping[int, str]               # graph node id -> axis label of D there
    length: int                             # length of D
    id: int = -1                            # the D-Graph component's id (-1: not from a D-Graph)


@dataclass(frozen=True)
class MemoryView:
    """What the scores need to know about memory, per graph node and storage."""

    allocs: Mapping[int, Mapping[int, int]]   # node -> {storage it allocates: bytes}
    reads: Mapping[int, frozenset[int]]       # node -> storages it reads
    hot: frozenset[int]                       # storages live at the peak (memory hot-spots)
    size: Mapping[int, int]                   # storage -> bytes


@dataclass(frozen=True)
class Scores:
    idom: dict[int, int | None]   # immediate dominator in G' (None: the virtual root)
    heat: dict[int, int]
    score: dict[int, float]       # only for nodes whose score was needed (see module doc)
    subtree: dict[int, tuple[int, ...]]  # T.des(v) including v, for nodes with a score


def dominator_tree(comp: ComponentView) -> dict[int, int | None]:
    """Immediate dominators of G' rooted at a virtual root above its entry nodes."""
    dag = rx.PyDiGraph()
    root = dag.add_node(None)
    index = {v: dag.add_node(v) for v in comp.nodes}
    for v in comp.nodes:
        preds = comp.preds.get(v, ())
        if not preds:
            dag.add_edge(root, index[v], None)
        for p in preds:
            dag.add_edge(index[p], index[v], None)
    idom = rx.immediate_dominators(dag, root)
    return {dag[i]: (None if d == root else dag[d]) for i, d in idom.items() if i != root}


def _dfs(comp: ComponentView, idom: Mapping[int, int | None]) -> tuple[list[int], dict[int, int], dict[int, int]]:
    """Pre-order of T and each node's [start, stop) range in it."""
    children: dict[int | None, list[int]] = {}
    for v in comp.nodes:
        children.setdefault(idom[v], []).append(v)
    order: list[int] = []
    start: dict[int, int] = {}
    stop: dict[int, int] = {}
    stack: list[tuple[int, bool]] = [(v, False) for v in reversed(children.get(None, []))]
    while stack:
        v, done = stack.pop()
        if done:
            stop[v] = len(order)
            continue
        start[v] = len(order)
        order.append(v)
        stack.append((v, True))
        stack.extend((c, False) for c in reversed(children.get(v, [])))
    return order, start, stop


def compute_scores(comp: ComponentView, mem: MemoryView, n: int = 2, levels: int = DEFAULT_LEVELS) -> Scores:
    """Eq. 3 heat for every node; Eq. 4 score for every node that could be selected."""
    idom = dominator_tree(comp)
    order, start, stop = _dfs(comp, idom)
    own_hot = {v: sum(b for s, b in mem.allocs.get(v, {}).items() if s in mem.hot) for v in comp.nodes}
    heat = dict.fromkeys(comp.nodes, 0)
    for v in reversed(order):  # children come after their parent in pre-order
        heat[v] += own_hot[v]
        parent = idom[v]
        if parent is not None:
            heat[parent] += heat[v]
    alloc_pos: dict[int, int] = {}
    for v in comp.nodes:
        for s in mem.allocs.get(v, {}):
            alloc_pos[s] = start[v]
    reads = _Reads(order, mem, alloc_pos)
    factor = 1 - 1 / n
    best = 0.0
    score: dict[int, float] = {}
    subtree: dict[int, tuple[int, ...]] = {}
    for v in sorted(comp.nodes, key=lambda x: -heat[x]):
        upper = factor * heat[v]
        if upper <= 0 or upper < best / levels:
            break
        score[v] = upper - reads.input_bytes(start[v] + 1, stop[v])   # S = T.des(v) minus v
        subtree[v] = tuple(order[start[v]:stop[v]])
        best = max(best, score[v])
    return Scores(idom, heat, score, subtree)


class _Reads:
    """The non-hot storages each node of a DFS order reads, as arrays (CSR by position), so
    that the inputs of a subtree are a slice: the nodes whose score is needed have nested
    subtrees that together span about the whole order many times over on a deep model, and
    a Python pass over each was quadratic in its size."""

    def __init__(self, order: Sequence[int], mem: MemoryView, alloc_pos: Mapping[int, int]) -> None:
        index: dict[int, int] = {}           # storage -> its column
        ptr = [0]
        read: list[int] = []
        hot = mem.hot
        for u in order:
            read.extend(index.setdefault(s, len(index)) for s in mem.reads.get(u, ()) if s not in hot)
            ptr.append(len(read))
        self.ptr = ptr
        self.read = np.asarray(read, dtype=np.int64)
        storages = list(index)
        self.size = np.fromiter((mem.size[s] for s in storages), dtype=np.int64, count=len(storages))
        # position of the node allocating each storage in the order; -1: none of the order's
        self.alloc = np.fromiter((alloc_pos.get(s, -1) for s in storages), dtype=np.int64, count=len(storages))

    def input_bytes(self, lo: int, hi: int) -> int:
        """Bytes of the non-hot storages the nodes at positions lo..hi-1 read and none of
        them allocates (lo >= 1)."""
        read = self.read[self.ptr[lo]:self.ptr[hi]]
        where = self.alloc[read]
        outside = read[(where < lo) | (where >= hi)]
        return int(self.size[np.unique(outside)].sum())


def select_dominators(scores: Scores, levels: int = DEFAULT_LEVELS) -> list[tuple[int, int]]:
    """(v_dom, i) pairs of Algorithm 1 lines 9-11, lowest interval first."""
    s_max = max(scores.score.values(), default=0.0)
    if s_max <= 0:
        return []
    picked = []
    for i in range(1, levels + 1):
        band = {v for v, s in scores.score.items() if i / levels <= s / s_max < (i + 1) / levels}
        for v in sorted(band):
            below = set(scores.subtree[v][1:])
            if not below & band:
                picked.append((v, i))
    return picked


def region_heat_and_score(region: frozenset[int], mem: MemoryView, n: int = 2) -> tuple[int, float]:
    """Eq. 3 and Eq. 4 for an explicit region S: hot bytes it allocates, and
    (1 - 1/n) of them minus the non-hot storages it reads but does not allocate."""
    allocated = {s for v in region for s in mem.allocs.get(v, {})}
    heat = sum(mem.size[s] for s in allocated if s in mem.hot)
    inputs = {s for v in region for s in mem.reads.get(v, ()) if s not in allocated and s not in mem.hot}
    return heat, (1 - 1 / n) * heat - sum(mem.size[s] for s in inputs)


def ftree_from_components(components: list[ComponentView], mem: MemoryView,
                          levels: int = DEFAULT_LEVELS, n: int = 2,
                          valid: Callable[[frozenset[int], ComponentView], frozenset[int] | None]
                          | None = None,
                          extra: Sequence[tuple[frozenset[int], ComponentView, int]] = (),
                          nested: Sequence[tuple[frozenset[int], ComponentView, int]] = (),
                          ) -> FTree:
    """Algorithm 1: the F-Tree (all nodes disabled, n = 1) over every component.

    valid(S, D) returns the region to keep (S itself, or S normalised, e.g. without
    trailing views) or None when the F-Trans is not valid. `extra` candidates
    (region, component, the node they centre on) join the dominator ones when no
    dominator region holds their centre, scored by Eq. 3/4 on the region itself,
    at level 1. `nested` candidates (the head-and-loss region) join them likewise even where
    a dominator region holds their centre: they nest inside it.
    """
    found: list[tuple[frozenset[int], ComponentView, int, float, int, int]] = []
    for comp in components:
        scores = compute_scores(comp, mem, n, levels)
        for v, i in select_dominators(scores, levels):
            region: frozenset[int] | None = frozenset(scores.subtree[v][1:])
            if region and valid is not None:
                region = valid(region, comp)
            if region and all(region != r for r, *_ in found):
                found.append((region, comp, v, scores.score[v], scores.heat[v], i))
    candidates = [(*item, False) for item in extra] + [(*item, True) for item in nested]
    for region, comp, v, nests in candidates:
        if not nests and components and any(v in r for r, *_ in found):
            continue
        kept = valid(region, comp) if valid is not None else region
        if kept and all(kept != r for r, *_ in found):
            heat, score = region_heat_and_score(kept, mem, n)
            found.append((kept, comp, v, score, heat, 1))
    found.sort(key=lambda item: (len(item[0]), item[2]))
    nodes: list[FNode] = []
    for k, (region, comp, v, score, heat, i) in enumerate(found):
        nodes.append(FNode(id=k, nodes=region, labels={u: comp.labels[u] for u in region},
                           length=comp.length, component=comp.id, dominator=v, score=score,
                           heat=heat, level=i))
    # parent: the smallest other candidate that strictly contains the region
    parented = []
    for f in nodes:
        parent = next((g.id for g in nodes if len(g.nodes) > len(f.nodes) and f.nodes < g.nodes), None)
        parented.append(replace(f, parent=parent))
    return FTree(tuple(parented))
