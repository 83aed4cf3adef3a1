"""NodeCache: values computed for Node objects, each kept with the explicit key it depends on.

A node never changes, so a value computed from a node alone (its op, arguments, outputs) can
be kept for the node object; a value that also read something else (the metas of the node's
tensors in some graph, a dimension rule) is kept with that as `depends` and given back only
for an equal one. Every graph holding the same node object (graphs derived by editing share
their unchanged nodes) finds the value again, but only where it still holds:

    RULES: NodeCache[tuple[DimRule | None]] = NodeCache()
    found = RULES.get(node, metas)          # None: not cached for these metas
    if found is None: RULES.put(node, found := (build(),), metas)

`slot` tells apart several values of one node (e.g. one per part of a split); each node and
slot keeps the last value put. An entry lives as long as its node object (a weak reference
drops it when the node is freed, before its id can be reused), so a cache holds nothing a
graph no longer does. A cache belongs to the module whose values it holds; the values are
pure functions of (node, slot, depends).
"""

from __future__ import annotations

import weakref
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

from peakcut.ir.node import Node

V = TypeVar("V")


class _Ref(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a node that knows the key of its entry."""

    __slots__ = ("key",)
    key: Hashable


class NodeCache(Generic[V]):
    """Values per node object and slot, each with what it depends on (module doc)."""

    def __init__(self) -> None:
        # id(node), or (id(node), slot) -> (depends, value, weak reference to the node)
        self._entries: dict[Hashable, tuple[object, V, _Ref]] = {}

    def __len__(self) -> int:
        """Entries held (nodes and slots)."""
        return len(self._entries)

    def entries(self) -> Mapping[Hashable, tuple[object, V, object]]:
        """The entries, for hot loops that look up many nodes (read them only: the table
        itself, not a read-only view, whose lookups cost more): id(node) (or (id(node), slot))
        -> (depends, value, weak reference to the node). An entry found under id(node) is
        that node's while the caller holds the node."""
        return self._entries

    def get(self, node: Node, depends: object = None, slot: Hashable = None) -> V | None:
        """The value put for this node object (and slot) with an equal `depends`, else None."""
        entry = self._entries.get(id(node) if slot is None else (id(node), slot))
        if entry is None or not (entry[0] is depends or entry[0] == depends):
            return None
        return entry[1]

    def put(self, node: Node, value: V, depends: object = None, slot: Hashable = None) -> None:
        """Keep `value` for `node` (and slot), valid while what it read equals `depends`."""
        key = id(node) if slot is None else (id(node), slot)
        old = self._entries.get(key)
        if old is None:     # an entry of this key is this node's: a freed node's is dropped
            ref = _Ref(node, self._drop)
            ref.key = key
        else:
            ref = old[2]
        self._entries[key] = (depends, value, ref)

    def _drop(self, ref: _Ref) -> None:
        entry = self._entries.get(ref.key)
        if entry is not None and entry[2] is ref:
            del self._entries[ref.key]
