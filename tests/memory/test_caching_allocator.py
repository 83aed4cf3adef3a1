"""The CUDA caching allocator model (peakcut.memory.caching_allocator) on hand-worked sequences,
and the allocation sequence of a step (peakcut.memory.allocations)."""

from __future__ import annotations

import pytest

from peakcut.memory.caching_allocator import AllocatorConfig, CachingAllocatorModel
from peakcut.memory.host_heap import HostHeapModel
from tests.simulate.helpers import GraphBuilder

KiB = 1 << 10
MiB = 1 << 20


def _model(**config: object) -> CachingAllocatorModel:
    return CachingAllocatorModel(AllocatorConfig(**config))   # type: ignore[arg-type]


def test_requests_round_to_512_bytes_and_small_ones_share_a_2_mib_segment() -> None:
    m = _model()
    assert m.malloc(0, 1).size == 512
    assert m.malloc(1, 513).size == 1024
    assert m.malloc(2, 0).size == 512
    assert (m.reserved, m.allocated, m.segments) == (2 * MiB, 2048, 1)


def test_the_small_pool_packs_four_512_kib_blocks_then_takes_a_new_segment() -> None:
    m = _model()
    for k in range(4):
        m.malloc(k, 512 * KiB)
    assert m.reserved == 2 * MiB          # each split: the rest (>= 512 bytes) stays free
    m.malloc(4, 512 * KiB)
    assert m.reserved == 4 * MiB and m.segments == 2


def test_large_requests_below_10_mib_take_a_20_mib_segment_and_share_it() -> None:
    m = _model()
    m.malloc(0, 2 * MiB)                   # 20 MiB segment, split: 18 MiB free
    m.malloc(1, 3 * MiB)                   # from the free 18 MiB
    assert (m.reserved, m.allocated, m.segments) == (20 * MiB, 5 * MiB, 1)


def test_a_rest_of_1_mib_or_less_is_not_split_and_counts_as_allocated() -> None:
    m = _model()
    m.malloc(0, 11 * MiB)                  # segment 12 MiB; the 1 MiB rest is not > 1 MiB
    assert (m.reserved, m.allocated, m.peak_allocated) == (12 * MiB, 12 * MiB, 12 * MiB)
    m.free(0)
    assert m.allocated == 0 and m.reserved == 12 * MiB      # cached, not given back


def test_best_fit_takes_the_smallest_free_block_that_holds_the_request() -> None:
    m = _model()
    m.malloc(0, 24 * MiB)
    m.malloc(1, 12 * MiB)
    m.free(0)
    m.free(1)
    b = m.malloc(2, 11 * MiB)
    assert b.size == 12 * MiB and m.reserved == 36 * MiB
    assert m.malloc(3, 23 * MiB).size == 24 * MiB and m.reserved == 36 * MiB


def test_freed_neighbours_merge_so_a_larger_request_fits_without_a_new_segment() -> None:
    m = _model()
    m.malloc(0, 4 * MiB)
    m.malloc(1, 4 * MiB)                   # both from one 20 MiB segment
    m.free(0)
    m.free(1)                              # 4 + 4 + 12 merge back into 20 MiB
    m.malloc(2, 15 * MiB)
    assert m.reserved == 20 * MiB and m.segments == 1


def test_max_split_size_keeps_large_blocks_whole_and_from_small_requests() -> None:
    m = _model(max_split_size=20 * MiB)
    m.malloc(0, 30 * MiB)
    m.free(0)
    m.malloc(1, 8 * MiB)                   # below max_split_size: never an oversize block
    assert m.reserved == 50 * MiB
    b = m.malloc(2, 25 * MiB)              # within 20 MiB of the 30 MiB block: takes it, unsplit
    assert b.size == 30 * MiB and m.reserved == 50 * MiB
    m.free(2)
    m.malloc(3, 13 * MiB)                  # the best fit is the oversize 30 MiB block: refused,
    assert m.reserved == 64 * MiB          # so a new 14 MiB segment (the 12 MiB rest is too small)
    big = _model(max_split_size=20 * MiB)
    big.malloc(0, 42 * MiB)
    big.free(0)
    big.malloc(1, 21 * MiB)                # 42 >= 21 + 20: too much larger, a new 22 MiB segment
    assert big.reserved == 64 * MiB
    plain = _model()
    plain.malloc(0, 30 * MiB)
    plain.free(0)
    plain.malloc(1, 8 * MiB)               # without the setting: split from the 30 MiB block
    assert plain.reserved == 30 * MiB


def test_expandable_segments_grow_one_segment_by_20_mib_pages() -> None:
    m = _model(expandable_segments=True)
    m.malloc(0, 3 * MiB)                   # one 20 MiB page mapped
    assert m.reserved == 20 * MiB
    m.malloc(1, 30 * MiB)                  # the free 17 MiB at the end grows by one page
    assert m.reserved == 40 * MiB and m.allocated == 33 * MiB
    m.free(0)
    m.free(1)
    m.malloc(2, 35 * MiB)                  # everything merged: 40 MiB free
    assert m.reserved == 40 * MiB and m.segments == 1
    fixed = _model()
    for k, size in enumerate((3 * MiB, 30 * MiB)):
        fixed.malloc(k, size)
    fixed.free(0)
    fixed.free(1)
    fixed.malloc(2, 35 * MiB)
    assert fixed.reserved == 20 * MiB + 30 * MiB + 36 * MiB


def test_expandable_segments_prefer_a_block_that_need_not_grow() -> None:
    m = _model(expandable_segments=True)
    m.malloc(0, 8 * MiB)
    m.malloc(1, 6 * MiB + 512 * KiB)       # 20 MiB page: 8 + 6.5 allocated, 5.5 MiB free at its end
    m.free(0)                              # a free 8 MiB block that cannot grow
    b = m.malloc(2, 5 * MiB)               # the 5.5 MiB end block fits best but could grow: not it
    assert b.ptr == 0 and m.reserved == 20 * MiB
    fixed = _model()
    fixed.malloc(0, 8 * MiB)
    fixed.malloc(1, 6 * MiB + 512 * KiB)
    fixed.free(0)
    assert fixed.malloc(2, 5 * MiB).ptr == 14 * MiB + 512 * KiB   # plain best fit: the 5.5 MiB block
    small = _model(expandable_segments=True)
    small.malloc(0, 1000)
    assert small.reserved == 2 * MiB       # the small pool maps 2 MiB pages


def test_a_capacity_gives_back_cached_segments_before_failing() -> None:
    m = _model(capacity=40 * MiB)
    m.malloc(0, 30 * MiB)
    m.free(0)
    m.malloc(1, 8 * MiB)                   # from the cached 30 MiB block (split)
    m.free(1)
    m.malloc(2, 36 * MiB)                  # 30 + 36 > 40: the unsplit cached segment goes back
    assert m.reserved == 36 * MiB
    with pytest.raises(MemoryError, match="capacity"):
        m.malloc(3, 10 * MiB)


def test_bad_calls_are_refused() -> None:
    m = _model()
    m.malloc(0, 10)
    with pytest.raises(ValueError, match="already allocated"):
        m.malloc(0, 10)
    with pytest.raises(KeyError, match="not allocated"):
        m.free(7)
    with pytest.raises(ValueError, match="20 MiB"):
        AllocatorConfig(max_split_size=MiB)


def test_the_host_heap_reuses_merges_and_gives_back_its_top() -> None:
    h = HostHeapModel()                    # a chunk: the bytes rounded up to 64, plus 64
    h.malloc(0, 1000)                      # 1088 at 0
    h.malloc(1, 1000)                      # 1088 at 1088
    h.malloc(2, 100)                       # 192 at 2176
    h.free(0)
    h.free(1)                              # merged: 2176 free at 0
    assert h.malloc(3, 2000) == 0          # 2112: from the merged chunk, the rest too small to split
    assert h.peak_reserved == 2368
    h.free(2)                              # the top chunk: back to the top
    h.free(3)
    assert (h.top, h.allocated, h.peak_reserved) == (0, 0, 2368)


def test_a_step_allocation_sequence_replays_held_storages_then_the_order() -> None:
    from peakcut.memory.allocations import FREE, predict_reserved, step_requests
    from peakcut.memory.lifetimes import step_lifetimes

    b = GraphBuilder()
    x = b.input("x", (256,))                                    # 1 KiB, caller-held
    a = b.op("aten.exp.default", x, shape=(256,), name="a")
    s = b.op("aten.sin.default", a, shape=(256,), name="s")
    c = b.op("aten.add.Tensor", a, s, shape=(256,), name="c")
    b.output(c)
    g = b.g
    sid = {t: g.tensors[t].storage for t in (x, a, s, c)}
    life = step_lifetimes(g, g.order)
    assert step_requests(life, steps=1) == [
        (sid[x], 1024), (sid[a], 1024), (sid[s], 1024), (sid[c], 1024), (sid[a], FREE), (sid[s], FREE),
        (sid[c], FREE)]
    found = predict_reserved(life, steps=2)
    assert (found.peak_reserved, found.peak_allocated) == (2 * MiB, 4096)
    assert "2 steps" in found.method
    on_host = predict_reserved(life, device="cpu")
    assert (on_host.peak_reserved, on_host.peak_allocated) == (4 * 1088, 4 * 1088)   # the top comes back
