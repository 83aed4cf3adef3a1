"""The exact arena layout of a small step: a mixed-integer model solved by HiGHS.

    found = exact_layout(size, lo, hi, lower=peak, upper=greedy_arena, time_limit=0.5)

Variables: the offset x[k] of every storage and the arena A; for every pair (i, j) of storages
live at the same time (their ranges [lo, hi) intersect) a binary z: z = 1 puts i below j
(x[i] + size[i] <= x[j]), z = 0 puts j below i, each written with a big-M of `upper`. Every
storage ends below A; A lies in [lower, upper] (the live-bytes peak, no layout is smaller;
a layout already found). Minimise A. Solved by HiGHS through scipy.optimize.milp within
`time_limit`; the answer is the best layout it found (None where it found none better than
`upper`), and whether HiGHS proved it optimal. scipy is imported only here, when called;
ExactLayoutUnavailable says how to install it where it is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from peakcut.memory.liveness import Int64Array

MAX_PAIRS = 2000        # above this many overlapping pairs the model is not built (too slow to prove)


class ExactLayoutUnavailable(ImportError):
    """The exact layout needs scipy (HiGHS), which is not installed."""


@dataclass(frozen=True)
class ExactLayout:
    """A layout HiGHS found: offsets, arena bytes, and whether it is proven optimal."""

    offsets: Int64Array
    arena: int
    optimal: bool


def overlapping_pairs(lo: Int64Array, hi: Int64Array) -> tuple[Int64Array, Int64Array]:
    """(i, j) with i < j of every two storages whose ranges [lo, hi) intersect."""
    together = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])
    i, j = np.nonzero(np.triu(together, k=1))
    return i.astype(np.int64), j.astype(np.int64)


def _milp() -> Any:
    try:
        from scipy.optimize import milp  # type: ignore[import-untyped]
    except ImportError as err:     # scipy is an optional dependency
        raise ExactLayoutUnavailable(
            "the exact arena layout (peakcut.memory.layout_exact) needs scipy >= 1.9 (HiGHS): "
            "pip install scipy, or lay out with exact=False") from err
    return milp


def exact_layout(size: Int64Array, lo: Int64Array, hi: Int64Array, *, lower: int, upper: int,
                 time_limit: float) -> ExactLayout | None:
    """The model of the module doc, solved for at most `time_limit` seconds; None when it has
    more than MAX_PAIRS pairs or HiGHS found no layout below `upper`."""
    milp = _milp()
    from scipy.optimize import Bounds, LinearConstraint  # _milp checked scipy is there
    from scipy.sparse import coo_array  # type: ignore[import-untyped]
    m = len(size)
    first, second = overlapping_pairs(lo, hi)
    p = len(first)
    if p > MAX_PAIRS or upper <= lower:
        return None
    unit = int(np.gcd.reduce(size)) if m else 1       # solve in units of the sizes' gcd: smaller numbers
    s = (size // unit).astype(np.float64)
    lower, upper = -(-lower // unit), upper // unit
    big = float(upper)
    # columns: x[0..m), z[0..p), A
    n_cols = m + p + 1
    arena_col = m + p
    rows = 2 * p + m
    r = np.arange(p)
    k = np.arange(m)
    # rows [0, p): x_i + s_i - x_j - M z <= 0        (z = 1: i below j)
    # rows [p, 2p): x_j + s_j - x_i + M z <= M       (z = 0: j below i)
    # rows [2p, 2p + m): x_k + s_k - A <= 0
    row = np.concatenate([r, r, r, p + r, p + r, p + r, 2 * p + k, 2 * p + k])
    col = np.concatenate([first, second, m + r, second, first, m + r, k, np.full(m, arena_col)])
    val = np.concatenate([np.ones(p), -np.ones(p), np.full(p, -big), np.ones(p), -np.ones(p), np.full(p, big),
                          np.ones(m), -np.ones(m)])
    a = coo_array((val, (row, col)), shape=(rows, n_cols)).tocsr()
    ub = np.concatenate([-s[first], big - s[second], -s])
    cost = np.zeros(n_cols)
    cost[arena_col] = 1.0
    low = np.zeros(n_cols)
    high = np.concatenate([np.maximum(upper - s, 0.0), np.ones(p), [float(upper)]])
    low[arena_col] = float(lower)
    integrality = np.concatenate([np.zeros(m), np.ones(p), [0]])
    result = milp(cost, constraints=LinearConstraint(a, -np.inf, ub), bounds=Bounds(low, high),
                  integrality=integrality, options={"time_limit": max(0.01, time_limit), "mip_rel_gap": 0.0})
    if result.x is None:
        return None
    offsets = np.rint(result.x[:m]).astype(np.int64) * unit
    arena = int((offsets + size).max()) if m else 0
    if arena >= upper * unit or not _disjoint(offsets, size, first, second):
        return None
    return ExactLayout(offsets=offsets, arena=arena, optimal=bool(result.status == 0))


def _disjoint(offsets: Int64Array, size: Int64Array, first: Int64Array, second: Int64Array) -> bool:
    """No two storages of a pair share a byte (the rounded solver answer is a layout)."""
    below = offsets[first] + size[first] <= offsets[second]
    above = offsets[second] + size[second] <= offsets[first]
    return bool((below | above).all()) and bool((offsets >= 0).all())
