"""Swaps on the copy streams: overlap, waiting for loads, memory released and taken again."""

from __future__ import annotations

import pytest

import peakcut
from peakcut.memory import simulate
from peakcut.simulate import COMPUTE, D2H, H2D, simulate_timeline
from tests.conftest import cnn_loss
from tests.simulate.helpers import FakeCost, constant, insert_swap, swap_chain

COMPUTE_S = 1.0
COPY_S = 3.0
BETWEEN = 6


def _swapped(load_late: bool):
    """The chain with `a` stored right after exp; loaded early (right after the store) or late."""
    g, a, exp, dot = swap_chain(between=BETWEEN)
    first_sin = g.order[g.order.index(exp) + 1]
    g, store, load = insert_swap(g, a, store_after=exp, load_before=dot if load_late else first_sin,
                                 users=[dot])
    return g, a, store, load, dot


def _cost(overlap: bool) -> FakeCost:
    return FakeCost(constant(COMPUTE_S), overlap_copies=overlap, copy=COPY_S)


def test_overlap_hides_the_copies():
    g, _, store, load, dot = _swapped(load_late=False)
    overlapped = simulate_timeline(g, None, _cost(True))
    inline = simulate_timeline(g, None, _cost(False))
    compute_nodes = len(g.nodes) - 2
    assert inline.latency_seconds == pytest.approx(compute_nodes * COMPUTE_S + 2 * COPY_S)
    assert overlapped.latency_seconds == pytest.approx(compute_nodes * COMPUTE_S)
    assert overlapped.latency_seconds < inline.latency_seconds
    assert (overlapped.stream_of(store), overlapped.stream_of(load)) == (D2H, H2D)
    assert inline.stream_of(store) == inline.stream_of(load) == COMPUTE
    # the load waits for its store; compute runs on meanwhile
    assert overlapped.start_of(load) == overlapped.end_of(store)
    assert overlapped.exposed_copy_seconds == 0.0
    assert inline.exposed_copy_seconds == pytest.approx(2 * COPY_S)


def test_consumer_waits_for_its_load():
    g, _, _, load, dot = _swapped(load_late=True)
    tl = simulate_timeline(g, None, _cost(True))
    last_sin = g.order[g.order.index(load) - 1]
    assert tl.start_of(load) == tl.end_of(last_sin)  # issued after the compute before it
    assert tl.start_of(dot) >= tl.end_of(load)
    assert tl.start_of(dot) > tl.end_of(last_sin)  # the compute stream idles, waiting
    assert tl.exposed_copy_seconds == pytest.approx(COPY_S)
    assert tl.latency_seconds == pytest.approx((len(g.nodes) - 2) * COMPUTE_S + COPY_S)


def test_early_load_is_hidden_late_load_is_exposed():
    early = simulate_timeline(_swapped(load_late=False)[0], None, _cost(True))
    late = simulate_timeline(_swapped(load_late=True)[0], None, _cost(True))
    assert early.exposed_copy_seconds == 0.0 < late.exposed_copy_seconds
    assert early.latency_seconds < late.latency_seconds


def _change_at_end(tl, nid: int) -> int:
    """Device bytes gained (negative: released) by the node's end event."""
    k = tl.end_index[tl.position[nid]]
    return int(tl.bytes[k] - tl.bytes[k - 1])


def test_memory_released_at_store_end_and_taken_at_load_start():
    g, a, store, load, dot = _swapped(load_late=True)
    size = g.storages[g.tensors[a].storage]
    tl = simulate_timeline(g, None, _cost(True))
    assert _change_at_end(tl, store) == -size
    assert tl.memory_at(load) - tl.memory_before(load) == size
    # between the two, the swapped storage is not on the device
    plain = simulate_timeline(swap_chain(between=BETWEEN)[0], None, _cost(True))
    mid = (tl.end_of(store) + tl.start_of(load)) / 2
    assert tl.bytes[tl.times.searchsorted(mid)] == plain.bytes[plain.times.searchsorted(mid)] - size


def test_store_in_flight_keeps_the_tensor():
    """While the copy runs, compute moves on and the storage is still live."""
    g, a, store, _, _ = _swapped(load_late=True)
    tl = simulate_timeline(g, None, _cost(True))
    plain = simulate_timeline(swap_chain(between=BETWEEN)[0], None, _cost(True))
    size = g.storages[g.tensors[a].storage]
    during = [nid for nid in g.order if tl.stream_of(nid) == COMPUTE
              and tl.start_of(store) <= tl.start_of(nid) < tl.end_of(store)]
    after = [nid for nid in g.order if tl.stream_of(nid) == COMPUTE
             and tl.end_of(store) <= tl.start_of(nid) < tl.end_of(g.order[-2])]
    assert during and after
    assert all(tl.memory_at(nid) == plain.memory_at(nid) for nid in during)
    assert all(tl.memory_at(nid) == plain.memory_at(nid) - size for nid in after)


def test_inline_swaps_match_the_spine_and_lower_the_peak():
    g, _, store, load, _ = _swapped(load_late=True)
    tl = simulate_timeline(g, None, _cost(False))
    prof = simulate(g)
    assert tl.peak_bytes == prof.peak_bytes
    assert [tl.memory_at(nid) for nid in prof.order] == prof.timeline.tolist()
    plain = swap_chain(between=BETWEEN)[0]
    assert tl.peak_bytes < simulate_timeline(plain, None, _cost(False)).peak_bytes
    assert not {h.storage for h in tl.hotspots} & g.host_storages()


def test_peak_during_a_copy_names_the_running_compute_node():
    g, _, _, load, dot = _swapped(load_late=False)
    tl = simulate_timeline(g, None, _cost(True))
    k = int(tl.bytes.argmax())
    assert tl.peak_time == tl.times[k]
    if tl.peak_node is not None:
        assert tl.stream_of(tl.peak_node) == COMPUTE
        assert tl.start_of(tl.peak_node) <= tl.peak_time <= tl.end_of(tl.peak_node)


def test_swap_in_a_captured_step(small_cnn):
    """Swap the conv output (read by batch norm forward and backward) of a captured step."""
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "sgd")
    conv = next(nid for nid in g.order if g.nodes[nid].op == "aten.convolution.default")
    (x,) = g.nodes[conv].output_ids()
    bn_fwd, bn_bwd = g.users(x)
    assert g.nodes[bn_bwd].op == "aten.native_batch_norm_backward.default"
    g, store, load = insert_swap(g, x, store_after=bn_fwd, load_before=bn_bwd, users=[bn_bwd])
    size = g.storages[g.tensors[x].storage]

    inline = simulate_timeline(g, None, FakeCost(constant(COMPUTE_S), False, COPY_S))
    prof = simulate(g)
    assert inline.peak_bytes == prof.peak_bytes
    assert [inline.memory_at(nid) for nid in prof.order] == prof.timeline.tolist()

    tl = simulate_timeline(g, None, FakeCost(constant(COMPUTE_S), True, COPY_S))
    assert _change_at_end(tl, store) == -size
    assert tl.memory_at(load) - tl.memory_before(load) == size
    assert tl.start_of(bn_bwd) >= tl.end_of(load)
    assert tl.latency_seconds < inline.latency_seconds
