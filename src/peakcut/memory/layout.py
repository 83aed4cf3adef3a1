"""Where each storage a step allocates lives: byte offsets in one arena, planned from lifetimes.

    lay = plan_layout(g, order)                      # one stream
    lay = plan_layout(g, order, events=events)       # a timed order (peakcut.memory.lifetimes)
    lay.offsets[storage_id], lay.arena_bytes, lay.live_peak_bytes, lay.fragmentation

Every storage the order allocates (peakcut.memory.liveness's rules; lifetimes in event points,
peakcut.memory.lifetimes) gets an offset such that two storages live at the same time never
share a byte; the arena is the largest offset + size. Its bytes are never fewer than the
peak of the placed storages' live bytes (live_peak_bytes), and arena / peak is the layout's
fragmentation. Not in the arena: the caller's storages (parameters, the batch, optimizer
state and buffers, held across steps: `held`), host storages, and the storages the caller
names `unplanned` (ops that cannot write into a given place). Sizes are rounded up to
`align` bytes, and every offset is a multiple of it.

The layout is the best of greedy orders (layout_greedy.py: largest first in the best-fitting
gap, long-lived first, ...), stopped as soon as one reaches the peak; where none does and the
step is small, an exact model (layout_exact.py: HiGHS) looks for a smaller arena within what
is left of `time_limit` and may prove its answer optimal.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from peakcut.ir.graph import Graph
from peakcut.memory.layout_exact import ExactLayoutUnavailable, exact_layout
from peakcut.memory.layout_greedy import greedy_layout
from peakcut.memory.lifetimes import Lifetimes, NodeEvents, interval_peak, step_lifetimes
from peakcut.memory.liveness import Int64Array

EXACT_MAX_STORAGES = 120    # "auto" tries the exact model on steps with at most this many planned storages
DEFAULT_ALIGN = 64          # bytes; the CPU allocator's alignment, a multiple of what GPU kernels need


@dataclass(frozen=True)
class Layout:
    """An arena layout of one step's storages (module doc).

    offsets: storage id -> byte offset in the arena; arena_bytes: the arena's size;
    live_peak_bytes: the peak of the placed storages' live bytes (unrounded); held: the
    caller's device storages (not in the arena) and held_bytes their bytes; unplanned: the
    storages left out at the caller's request, unplanned_bytes their bytes; method: how the
    offsets were found; optimal: the arena is proven smallest (it equals the rounded peak,
    or HiGHS proved it); seconds: the time the layout took.
    """

    offsets: dict[int, int]
    arena_bytes: int
    live_peak_bytes: int
    held: tuple[int, ...]
    held_bytes: int
    unplanned: tuple[int, ...]
    unplanned_bytes: int
    align: int
    method: str
    optimal: bool
    seconds: float
    lifetimes: Lifetimes = field(repr=False, compare=False)

    @property
    def fragmentation(self) -> float:
        """arena_bytes / live_peak_bytes (1.0 for an empty arena)."""
        return self.arena_bytes / self.live_peak_bytes if self.live_peak_bytes else 1.0

    def as_dict(self) -> dict[str, Any]:
        """The layout's figures (not the offsets), for a report."""
        return {"arena_bytes": self.arena_bytes, "live_peak_bytes": self.live_peak_bytes,
                "fragmentation": self.fragmentation, "planned": len(self.offsets), "held": len(self.held),
                "held_bytes": self.held_bytes, "unplanned": len(self.unplanned),
                "unplanned_bytes": self.unplanned_bytes, "align": self.align, "method": self.method,
                "optimal": self.optimal, "seconds": round(self.seconds, 4)}


def plan_layout(g: Graph, order: Sequence[int], *, events: NodeEvents | None = None,
                unplanned: Collection[int] = (), align: int = DEFAULT_ALIGN, time_limit: float = 1.0,
                exact: bool | str = "auto") -> Layout:
    """Lay out the storages `order` allocates in one arena (module doc).

    events: the order's timed curve points (streams), None for one stream. unplanned: storage
    ids left out of the arena. time_limit: seconds for the greedy orders after the first
    and the exact model. exact: "auto" (the exact model on small steps whose greedy arena is
    above the peak, where scipy is installed), True (also on larger steps; scipy required),
    False (greedy only).
    """
    t0 = time.perf_counter()
    if not isinstance(align, int) or isinstance(align, bool) or align < 1:
        raise ValueError(f"align={align!r}: expected a whole number of bytes >= 1")
    if exact not in (True, False, "auto"):
        raise ValueError(f"exact={exact!r}: expected True, False or 'auto'")
    life = step_lifetimes(g, order, events)
    left_out = set(unplanned)
    keep = np.fromiter((s not in left_out for s in life.storages), dtype=np.bool_, count=len(life.storages))
    placed = np.flatnonzero(keep)
    size = life.size[placed]
    rounded = -(-size // align) * align
    lo = life.alloc_at[placed]
    hi = life.free_at[placed]
    offsets, arena, method, optimal = layout_intervals(rounded, lo, hi, points=life.points,
                                                       deadline=t0 + time_limit, exact=exact)
    storages = [life.storages[k] for k in placed.tolist()]
    skipped = [life.storages[k] for k in np.flatnonzero(~keep).tolist()]
    return Layout(offsets=dict(zip(storages, offsets.tolist(), strict=True)), arena_bytes=arena,
                  live_peak_bytes=interval_peak(size, lo, hi, life.points), held=life.held,
                  held_bytes=life.held_bytes, unplanned=tuple(skipped),
                  unplanned_bytes=int(life.size[~keep].sum()), align=align, method=method, optimal=optimal,
                  seconds=time.perf_counter() - t0, lifetimes=life)


def layout_intervals(size: Int64Array, lo: Int64Array, hi: Int64Array, *, points: int,
                     deadline: float = float("inf"),
                     exact: bool | str = "auto") -> tuple[Int64Array, int, str, bool]:
    """Offsets for storages of `size` bytes live on [lo, hi) (points: the time range's end):
    (offsets, arena bytes, method, optimal). The greedy orders, then the exact model where
    `exact` asks for it and the greedy arena is above the peak (see plan_layout)."""
    bound = interval_peak(size, lo, hi, points)
    offsets, arena, order_name = greedy_layout(size, lo, hi, bound, deadline)
    method = f"greedy ({order_name})"
    optimal = arena <= bound
    if optimal or exact is False or (exact == "auto" and len(size) > EXACT_MAX_STORAGES):
        return offsets, arena, method, optimal
    left = deadline - time.perf_counter()
    if left <= 0:
        return offsets, arena, method, optimal
    try:
        found = exact_layout(size, lo, hi, lower=bound, upper=arena, time_limit=min(left, 1e6))
    except ExactLayoutUnavailable:
        if exact is True:
            raise
        return offsets, arena, method + "; exact model skipped: scipy not installed", optimal
    if found is not None:
        return found.offsets, found.arena, "exact (HiGHS)", found.optimal
    return offsets, arena, method + "; the exact model found no smaller arena", optimal


def overlaps(offsets: Int64Array, size: Int64Array, lo: Int64Array, hi: Int64Array) -> list[tuple[int, int]]:
    """Pairs (i, j), i < j, of storages live at the same time that share a byte (a layout's
    check: none for a valid one)."""
    together = (lo[:, None] < hi[None, :]) & (lo[None, :] < hi[:, None])
    apart = (offsets[:, None] + size[:, None] <= offsets[None, :]) | (offsets[None, :] + size[None, :]
                                                                       <= offsets[:, None])
    i, j = np.nonzero(np.triu(together & ~apart, k=1))
    return list(zip(i.tolist(), j.tolist(), strict=True))
