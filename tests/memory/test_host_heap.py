"""The host heap model under glibc's default policy (peakcut.memory.host_heap, keeps_freed=False)
on hand-worked sequences, and the report's reserved bytes naming the allocator modelled."""

from __future__ import annotations

from peakcut.cost.model import get_cost_model
from peakcut.memory.host_heap import MMAP_THRESHOLD, TOP_PAD, HostHeapModel, memalign_request
from peakcut.optimizer.arena import arena_entries
from tests.simulate.helpers import GraphBuilder

KiB = 1 << 10
MiB = 1 << 20


def test_posix_memalign_asks_malloc_for_the_chunk_and_its_alignment_room() -> None:
    assert memalign_request(MiB) == MiB + 16 + 112          # n + 8 rounded to 16, + 64 + MINSIZE + 16
    assert memalign_request(0) == 32 + 112                  # the smallest chunk


def test_a_freed_chunk_is_too_small_for_a_tensor_of_its_own_size() -> None:
    for keeps_freed in (True, False):
        h = HostHeapModel(keeps_freed=keeps_freed)
        h.malloc(0, 1000)                                   # 1088 at 0
        h.malloc(1, 100)                                    # 192 at 1088
        h.free(0)                                           # 1088 free at 0: less than 1008 + 112
        assert h.malloc(2, 1000) == 1280                    # from the top
        assert h.malloc(3, 900) == 0                        # 912 + 112 fits: 1024 taken, 64 left


def test_a_large_request_is_mapped_and_its_free_raises_the_mmap_threshold() -> None:
    h = HostHeapModel(keeps_freed=False)
    assert h.malloc(0, MiB) == -1                           # 1 MiB + 128 >= 128 KiB: mapped
    mapped = 257 * 4096                                     # (1 MiB + 136) rounded up to pages
    assert (h.mapped_bytes, h.peak_reserved, h.top) == (mapped, mapped, 0)
    h.free(0)                                               # unmapped: its 1 MiB + 4048 is the new threshold
    assert (h.mapped_bytes, h.mmap_threshold, h.trim_threshold) == (0, mapped - 48, 2 * (mapped - 48))
    assert h.malloc(1, MiB) == 0                            # below the threshold now: from the heap
    assert (h.top, h.peak_reserved) == (MiB + 64, mapped)
    assert h.malloc(2, 64 * MiB) == -1                      # above 32 MiB: mapped, and its free
    h.free(2)                                               # leaves the threshold alone
    assert h.mmap_threshold == mapped - 48


def test_a_request_above_the_threshold_takes_a_free_heap_chunk_first() -> None:
    h = HostHeapModel(keeps_freed=False)
    for k in range(3):                                      # 100 KiB + 64 each: below 128 KiB, in the heap
        assert h.malloc(k, 100 * KiB) == k * (100 * KiB + 64)
    h.free(0)
    h.free(1)                                               # merged: 200 KiB + 128 free at 0
    assert h.mmap_threshold == MMAP_THRESHOLD
    assert h.malloc(3, 150 * KiB) == 0                      # >= the threshold, yet the free chunk holds it
    assert h.free_keys == [(50 * KiB + 64, 150 * KiB + 64)]
    assert h.malloc(4, 150 * KiB) == -1                     # nothing in the heap holds it: mapped


def test_a_free_top_above_the_trim_threshold_is_trimmed() -> None:
    h = HostHeapModel(keeps_freed=False)
    h.malloc(0, MiB)
    h.free(0)                                               # threshold 1 MiB + 4048, trim twice that
    h.malloc(1, MiB)                                        # [0, 1 MiB + 64)
    h.malloc(2, MiB)                                        # [1 MiB + 64, 2 MiB + 128)
    h.free(2)                                               # back to the top: 1 MiB + 64 + TOP_PAD free, kept
    assert (h.top, h.end) == (MiB + 64, 2 * MiB + 128)
    h.free(1)                                               # 2 MiB + 128 + TOP_PAD free >= the trim threshold
    assert (h.top, h.brk, h.end) == (0, TOP_PAD, TOP_PAD)
    h.malloc(3, 2 * MiB)                                    # 2 MiB + 64 > the threshold: mapped, the heap stays
    assert h.end == TOP_PAD and h.peak_reserved == TOP_PAD + 513 * 4096


def test_the_kept_heap_never_maps_nor_trims() -> None:
    h = HostHeapModel(keeps_freed=True)
    assert h.malloc(0, 64 * MiB) == 0
    h.free(0)
    assert (h.top, h.end, h.mapped_bytes, h.peak_reserved) == (0, 64 * MiB + 64, 0, 64 * MiB + 64)


def test_the_report_predicts_reserved_bytes_for_the_allocator_the_plan_runs_under() -> None:
    b = GraphBuilder()
    x = b.input("x", (MiB // 4,))                           # 1 MiB each, caller-held x
    a = b.op("aten.exp.default", x, shape=(MiB // 4,), name="a")
    s = b.op("aten.sin.default", a, shape=(MiB // 4,), name="s")
    c = b.op("aten.add.Tensor", a, s, shape=(MiB // 4,), name="c")
    b.output(c)
    g = b.g
    cost = get_cost_model("cpu")
    default = arena_entries(g, g.order, cost, None, 0.0)
    kept = arena_entries(g, g.order, cost, None, 0.0, host_keeps_freed=True)
    assert "glibc's defaults" in default["layout"]["reserved_method"]
    assert "keeping freed memory" in kept["layout"]["reserved_method"]
    assert default["layout"]["allocator"] == kept["layout"]["allocator"] == "cpu"
    # defaults: the first step maps all four (the second takes a, s, c from the heap, 4 KiB less)
    assert default["predicted_reserved_bytes"] == 4 * 257 * 4096
    assert kept["predicted_reserved_bytes"] == 4 * (MiB + 64)
