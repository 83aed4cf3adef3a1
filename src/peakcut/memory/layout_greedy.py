"""Greedy arena layouts: storages placed one by one, each in the gap that fits it best.

    offsets, arena = greedy_layout(size, lo, hi, bound, deadline)

Storage k needs size[k] bytes on the half-open time range [lo[k], hi[k]). Storages are taken
in one order (largest first; then longest-lived first, or largest size x lifetime first)
and each is put at an offset where it overlaps no storage placed before it that is live at
the same time: in the smallest gap between those that holds it (best fit) or the lowest
(first fit), else on top of them. Largest-first best fit is the greedy-by-size layout of
inference engines; long-lived-first is the placement of OLLA's and ROAM's heuristics (the
activations that live from the forward to the backward at the bottom). `greedy_layout`
runs the orders until one reaches `bound` (the live-bytes peak, which no layout beats) or
the deadline passes, and keeps the smallest arena. Each placement scans the storages
placed so far (numpy), so a layout of m storages costs O(m^2) element operations: about
0.2 s for the 5,000 storages of a 10,000-op LLM step.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from peakcut.memory.liveness import Int64Array

_TOP = np.iinfo(np.int64).max


def place(size: Int64Array, lo: Int64Array, hi: Int64Array, order: Int64Array, best_fit: bool) -> Int64Array:
    """Offsets of the storages placed in `order` (module doc), best or first fit. The placed
    storages are kept sorted by offset, so the gaps among those live at the same time come
    out in order without sorting."""
    m = len(size)
    placed = np.empty((4, m), dtype=np.int64)      # rows: offset, end, lo, hi; columns by offset
    offset = np.zeros(m, dtype=np.int64)
    for count, k in enumerate(order.tolist()):
        a = lo[k]
        b = hi[k]
        s = size[k]
        offs, ends, los, his = placed[:, :count]
        near = (los < b) & (his > a)
        at = 0
        if near.any():
            tops = np.maximum.accumulate(ends[near])
            starts = np.concatenate(([0], tops))           # gap j: from starts[j] to stops[j]
            stops = np.concatenate((offs[near], [_TOP]))
            gaps = stops - starts
            fits = np.flatnonzero(gaps >= s)
            j = fits[np.argmin(gaps[fits])] if best_fit else fits[0]
            at = int(starts[j])
        offset[k] = at
        i = int(np.searchsorted(offs, at, side="right"))
        placed[:, i + 1:count + 1] = placed[:, i:count]
        placed[:, i] = (at, at + s, a, b)
    return offset


ORDER_NAMES = ("largest first, best fit", "largest first, first fit", "largest size x lifetime first",
               "longest-lived first, best fit")


def _orders(size: Int64Array, lo: Int64Array, hi: Int64Array) -> list[tuple[Callable[[], Int64Array], bool]]:
    """The placement orders greedy_layout tries, best first (ties: earlier allocated first)."""
    life = hi - lo
    return [
        (lambda: np.lexsort((lo, -size)), True),                  # largest first, best fit
        (lambda: np.lexsort((lo, -size)), False),                 # largest first, lowest gap
        (lambda: np.lexsort((lo, -(size * life))), False),        # largest size x lifetime first
        (lambda: np.lexsort((lo, -size, -life)), True),           # longest-lived first
    ]


def greedy_layout(size: Int64Array, lo: Int64Array, hi: Int64Array, bound: int,
                  deadline: float = float("inf")) -> tuple[Int64Array, int, str]:
    """The smallest arena of the greedy orders tried (module doc): (offsets, arena bytes,
    the order that made it). The first order always runs; the others while the arena is
    above `bound` and time.perf_counter() is before `deadline`."""
    tried = list(zip(_orders(size, lo, hi), ORDER_NAMES, strict=True))
    best: tuple[Int64Array, int, str] = (np.zeros(0, dtype=np.int64), _TOP, "")
    for i, ((make, best_fit), name) in enumerate(tried):
        if i and (best[1] <= bound or time.perf_counter() >= deadline):
            break
        offsets = place(size, lo, hi, make(), best_fit)
        arena = int((offsets + size).max()) if len(size) else 0
        if arena < best[1]:
            best = (offsets, arena, name)
    return best
