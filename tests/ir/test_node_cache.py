"""NodeCache: values per node object, given back only for an equal `depends`, dropped with
their node."""

from __future__ import annotations

import gc

from peakcut.ir.node import Node, TensorRef
from peakcut.ir.node_cache import NodeCache


def neg(nid: int) -> Node:
    return Node(nid, "aten.neg.default", (TensorRef(1),), {}, (2,))


def test_a_value_comes_back_for_the_same_node_and_equal_depends():
    cache: NodeCache[str] = NodeCache()
    a, twin = neg(3), neg(3)
    assert a == twin and a is not twin
    cache.put(a, "rule", (1, 2))
    assert cache.get(a, (1, 2)) == "rule"
    assert cache.get(a, (1, 3)) is None          # read something else: not valid
    assert cache.get(twin, (1, 2)) is None       # another node object
    cache.put(a, "other", (1, 3))                # a node keeps the last value of a slot
    assert cache.get(a, (1, 2)) is None and cache.get(a, (1, 3)) == "other"


def test_slots_keep_several_values_of_one_node():
    cache: NodeCache[int] = NodeCache()
    a = neg(3)
    for k in range(3):
        cache.put(a, k, "rule", slot=("d0", 3, k))
    assert [cache.get(a, "rule", slot=("d0", 3, k)) for k in range(3)] == [0, 1, 2]
    assert cache.get(a, "rule") is None and len(cache) == 3


def test_entries_go_with_their_node():
    cache: NodeCache[int] = NodeCache()
    nodes = [neg(i) for i in range(50)]
    for i, n in enumerate(nodes):
        cache.put(n, i)
        cache.put(n, -i, slot="other")
    del nodes, n
    gc.collect()
    assert len(cache) == 0
    fresh = [neg(i) for i in range(200)]          # some take a freed node's id
    assert all(cache.get(n) is None and cache.get(n, slot="other") is None for n in fresh)
