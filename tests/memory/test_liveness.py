"""The alloc/free rules in array form (peakcut.memory.liveness), on hand-built and captured graphs."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import peakcut
from peakcut.ir.graph import Graph
from peakcut.memory.liveness import last_by_end, live_bytes, spans, storage_touches
from tests.conftest import SmallCNN, cnn_loss
from tests.simulate.helpers import GraphBuilder, insert_swap, random_topological_order, swap_chain


def _chain() -> tuple[Graph, dict[str, int]]:
    """x -> a = exp(x) -> b = sin(a) -> c = add(a, b) (program output); x is caller-held."""
    b = GraphBuilder()
    x = b.input("x", (8,))
    a = b.op("aten.exp.default", x, shape=(8,), name="a")
    s = b.op("aten.sin.default", a, shape=(8,), name="b")
    c = b.op("aten.add.Tensor", a, s, shape=(8,), name="c")
    b.output(c)
    return b.g, {"x": x, "a": a, "b": s, "c": c}


def test_touches_spans_and_bytes_of_a_chain() -> None:
    g, t = _chain()
    touches = storage_touches(g, g.order)
    storage = {name: g.tensors[tid].storage for name, tid in t.items()}
    assert touches.storages == [storage["a"], storage["b"], storage["c"]]   # first-touch order
    assert touches.owner == [t["a"], t["b"], t["c"]]
    assert touches.held == {storage["x"]} and touches.baseline == 32
    assert touches.to_end.tolist() == [False, False, True]
    first, last = spans(touches)
    assert first.tolist() == [0, 1, 2]
    assert last.tolist() == [2, 2, 2]          # a read by add; c a program output (n - 1)
    assert live_bytes(touches.size, first, last, 3).tolist() == [32, 64, 96]


def test_host_storages_never_count() -> None:
    g, a, exp, dot = swap_chain(between=4)
    g, store, load = insert_swap(g, a, exp, dot, [dot])
    touches = storage_touches(g, g.order)
    host = g.host_storages()
    assert host and not host & set(touches.storages)
    assert not g.caller_held_storages() & set(touches.storages)


def test_positions_give_the_spans_of_the_reordered_sequence() -> None:
    """spans(touches, position) for another order == spans of touches built in that order."""
    torch.manual_seed(0)
    g = peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))), cnn_loss, "adamw")
    touches = storage_touches(g, g.order)
    for seed in range(3):
        order = random_topological_order(g, seed)
        index = {nid: v for v, nid in enumerate(g.order)}
        position = np.empty(len(order), dtype=np.int64)
        position[[index[nid] for nid in order]] = np.arange(len(order))
        first, last = spans(touches, position)
        again = storage_touches(g, order)
        k_of = {s: k for k, s in enumerate(again.storages)}
        first2, last2 = spans(again)
        assert set(touches.storages) == set(again.storages)
        for k, s in enumerate(touches.storages):
            assert (first[k], last[k]) == (first2[k_of[s]], last2[k_of[s]])


def test_last_by_end_takes_the_toucher_that_ends_last_then_the_later() -> None:
    g, t = _chain()
    touches = storage_touches(g, g.order)
    # a is touched by nodes 0 (writes), 1 and 2 (read); b by 1 and 2; c by 2
    assert last_by_end(touches, np.array([5.0, 1.0, 2.0])).tolist() == [0, 2, -1]
    assert last_by_end(touches, np.array([1.0, 3.0, 3.0])).tolist() == [2, 2, -1]   # tie: the later
    assert last_by_end(touches, np.array([1.0, 4.0, 3.0])).tolist() == [1, 1, -1]


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(0, 1000), min_size=1, max_size=12), data=st.data())
def test_live_bytes_is_the_sum_over_live_intervals(sizes: list[int], data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 10))
    first = [data.draw(st.integers(0, n - 1)) for _ in sizes]
    last = [data.draw(st.integers(f, n - 1)) for f in first]
    got = live_bytes(np.array(sizes, dtype=np.int64), np.array(first, dtype=np.int64),
                     np.array(last, dtype=np.int64), n)
    want = [sum(s for s, f, lst in zip(sizes, first, last, strict=True) if f <= i <= lst) for i in range(n)]
    assert got.tolist() == want
