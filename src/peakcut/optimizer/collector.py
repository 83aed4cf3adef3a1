"""Python's garbage collector, relaxed while the search runs.

A search builds and drops many graphs of thousands of small objects (nodes, metas, tuples).
With the default thresholds the cyclic collector runs every 700 allocations and re-scans
the long-lived graphs (the base, its F-Tree, the memos) each time its oldest generation is
collected: about a fifth of a ViT-base search went to it. `relaxed_collection` moves what
exists when the search starts to the permanent generation (gc.freeze: never scanned) and
collects the young generation less often; both are undone on exit. Reference counting
frees almost everything anyway; the collector only reclaims cycles, later.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 50_000    # allocations between young collections (CPython default: 700)


@contextmanager
def relaxed_collection() -> Iterator[None]:
    """Freeze what exists and collect less often inside the block (see module doc)."""
    thresholds = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(YOUNG_THRESHOLD, thresholds[0]), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
