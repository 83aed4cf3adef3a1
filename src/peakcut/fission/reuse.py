"""Expansions that start alike, made once: snapshots of an expansion after each region.

    cache = ExpansionCache()
    expand(g, order, tree_a, dgraph, compact=True, reuse=cache)   # regions r, then c inside r
    expand(g, order, tree_b, dgraph, compact=True, reuse=cache)   # r as before, then c at
                                                                  # another n: starts after r
An optimizer derives many F-Trees of one graph that differ in one node (enabled, lifted, its n
changed); re-expanding the regions before it for each of them is most of the cost of a fission
state. expand() expands the enabled regions one after the other on a private graph, in an
order fixed by the tree (roots, then each part's nested regions, depth first). After each it
saves a snapshot of that graph, its order, the dimension rules, the regions and their parts
so far, keyed by the steps taken (F-Tree node, n, enclosing parts, nodes, labels, component)
on that graph, order, D-Graph and mode. A later expansion whose steps begin with a
snapshot's starts from the longest such snapshot.

A region's expansion is a pure function of the graph it starts from and its step, so a
snapshot holds exactly what taking its steps again would give, and the result is the same
as without the cache (node ids included).

The snapshots hold the objects their keys name by id (graph, D-Graph, F-Tree labels), so
those ids cannot be reused while an entry lives. At most `limit` entries are kept, the least
recently used dropped first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from peakcut.fission.dgraph import DGraph
from peakcut.ir.dims import DimRule
from peakcut.ir.graph import Graph
from peakcut.ir.tags import Path


class ExpansionStep(NamedTuple):
    """One region expansion, as snapshots are keyed by it: what decides how it expands."""

    fnode: int                   # F-Tree node id
    n: int
    path: Path                   # enclosing (F-Tree node, part) pairs, outermost first
    nodes: frozenset[int]        # the region's original nodes
    labels: int                  # id() of the F-Tree node's labels (kept alive by the snapshot)
    component: int

SNAPSHOTS_KEPT = 16
LINK_DEPTH = 2      # rewrites a snapshot is carried back through (see ExpansionCache.link)


@dataclass(frozen=True)
class Snapshot:
    """An expansion after its first steps: what the expander needs to go on from there."""

    graph: Graph                                  # the expander's graph (copied again before use)
    order: tuple[int, ...]
    rules: dict[int, DimRule]
    regions: tuple[Any, ...]                      # ExpandedRegion records so far
    next_id: int
    steps: tuple[ExpansionStep, ...]
    parts: tuple[tuple[dict[int, int], ...], ...]  # per step: per part, node -> copy
    held: tuple[Any, ...] = ()                    # objects the key names by id (kept alive)


Edit = Callable[[Graph, list[int]], "tuple[Graph, list[int], Sequence[int]] | None"]
"""A rewrite applied to a snapshot's graph and order: (graph, order, removed nodes), or None
where it cannot make the edit it made on the base there."""


@dataclass(frozen=True)
class Link:
    """new_g is old_g rewritten by `edit` with the same D-Graph and F-Tree (see ExpansionCache.link)."""

    new_g: Graph
    old_g: Graph
    old_order: tuple[int, ...]
    dgraph: DGraph
    edit: Edit


@dataclass
class ExpansionCache:
    """Snapshots of expansions after each region (see module doc); hits/misses count lookups,
    carried the snapshots made from a linked graph's."""

    limit: int = SNAPSHOTS_KEPT
    hits: int = 0
    misses: int = 0
    carried: int = 0

    def __post_init__(self) -> None:
        self._entries: OrderedDict[tuple[Any, ...], Snapshot] = OrderedDict()
        self._links: OrderedDict[int, Link] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    @staticmethod
    def _source(g: Graph, order: Sequence[int], dgraph: DGraph, compact: bool) -> tuple[Any, ...]:
        return (id(g), id(dgraph), compact, len(order))

    def longest(self, g: Graph, order: Sequence[int], dgraph: DGraph, compact: bool,
                steps: Sequence[ExpansionStep]) -> Snapshot | None:
        """The snapshot of the longest prefix of `steps` taken from this graph and order, or
        (compact) carried from the graph it was rewritten from (link) when that has a longer one."""
        found = self._find(g, order, dgraph, compact, steps, LINK_DEPTH)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def _find(self, g: Graph, order: Sequence[int], dgraph: DGraph, compact: bool, steps: Sequence[ExpansionStep],
              depth: int) -> Snapshot | None:
        found = self._local(g, order, dgraph, compact, steps)
        have = 0 if found is None else len(found.steps)
        link = self._links.get(id(g))
        if (not compact or depth == 0 or have == len(steps) or link is None or link.new_g is not g
                or link.dgraph is not dgraph):
            return found
        older = self._find(link.old_g, link.old_order, dgraph, True, steps, depth - 1)
        if older is None or len(older.steps) <= have:
            return found
        edited = link.edit(older.graph, list(older.order))
        if edited is None:
            return found
        graph, edited_order, removed = edited
        gone = set(removed)
        rules = {v: r for v, r in older.rules.items() if v not in gone}
        self.carried += 1
        return self.save(g, order, dgraph, True,
                         Snapshot(graph, tuple(edited_order), rules, older.regions, older.next_id, older.steps,
                                  older.parts), older.held[3])

    def _local(self, g: Graph, order: Sequence[int], dgraph: DGraph, compact: bool,
               steps: Sequence[ExpansionStep]) -> Snapshot | None:
        source = self._source(g, order, dgraph, compact)
        for m in range(len(steps), 0, -1):
            key = (*source, tuple(steps[:m]))
            snap = self._entries.get(key)
            if snap is not None and snap.held[0] is g and snap.held[1] is dgraph and \
                    list(snap.held[2]) == list(order):
                self._entries.move_to_end(key)
                return snap
        return None

    def save(self, g: Graph, order: Sequence[int], dgraph: DGraph, compact: bool, snap: Snapshot,
             held: tuple[Any, ...]) -> Snapshot:
        """Keep `snap` (made after taking snap.steps from g under order); `held`: the objects
        (F-Tree labels) its steps name by id. Returns the kept snapshot."""
        key = (*self._source(g, order, dgraph, compact), snap.steps)
        kept = self._entries.get(key)
        if kept is not None:
            self._entries.move_to_end(key)
            return kept
        kept = self._entries[key] = Snapshot(snap.graph, snap.order, snap.rules, snap.regions, snap.next_id,
                                             snap.steps, snap.parts, (g, dgraph, tuple(order), held))
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)
        return kept

    def link(self, old_g: Graph, old_order: Sequence[int], new_g: Graph, dgraph: DGraph, edit: Edit) -> None:
        """Note that new_g is old_g (under old_order) rewritten by `edit`, keeping D-Graph and
        F-Tree: a compact expansion of new_g that finds no snapshot of its own as long as one
        of old_g's (at most LINK_DEPTH links back) starts from that one edited by `edit`. The
        edited snapshot stands for expanding new_g along the same steps: the same regions,
        parts and ids, with the rewrite made after rather than before (an equivalent program;
        ids and control edges may differ from a fresh expansion's)."""
        self._links[id(new_g)] = Link(new_g, old_g, tuple(old_order), dgraph, edit)
        self._links.move_to_end(id(new_g))
        while len(self._links) > self.limit:
            self._links.popitem(last=False)
