"""The search's relaxed garbage collection is undone on the way out, errors included."""

import gc

import pytest

from peakcut.optimizer.collector import YOUNG_THRESHOLD, relaxed_collection


def test_relaxed_collection_restores_the_collector() -> None:
    before = gc.get_threshold()
    with relaxed_collection():
        assert gc.get_threshold()[0] >= YOUNG_THRESHOLD
        assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_relaxed_collection_restores_after_an_error() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), relaxed_collection():
        raise RuntimeError("inside the search")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cycles_made_inside_are_collected_after() -> None:
    class Cell:
        other: object = None

    with relaxed_collection():
        a, b = Cell(), Cell()
        a.other, b.other = b, a
        del a, b
    assert gc.collect() >= 2
