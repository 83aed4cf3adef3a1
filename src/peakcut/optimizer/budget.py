"""A measured cost model inside a time budget: calls not measured yet are priced at once by
fitted prices and measured in slices between the search's expansions.

Measuring a call takes milliseconds at medium size, and a fissioned or rewritten program
brings many new calls, so nothing waits for them: a call whose key is not in the table is
priced by the measured calls of its family (MeasuredCostModel.fitted_seconds,
peakcut.cost.fitted) and queued. measure_some(seconds) measures queued calls, those priced
highest first; a MeasurePacer calls it between expansions so that measuring takes at most
MEASURE_DUTY of the search's wall time (a slice at a time: on a CPU a timing thread beside
the search would slow both and make the timings wrong, so the search waits while a slice
runs). A measured call replaces its fitted price for every state priced afterwards; states
priced before keep theirs, and reprice() prices the search's bests, its root and the eager
step again (their calls measured first, as far as `deadline` allows) before they are
judged and verified. No measuring starts after `deadline`; what is still fitted then is
counted (`fitted`), so the report can say how many figures are fitted prices.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from peakcut.cost.calls import call_key, copy_key, is_swap, swap_transfer
from peakcut.cost.measured import Job, MeasuredCostModel
from peakcut.ir.graph import Graph

MEASURE_DUTY = 0.1
"""The share of the search's wall time the slices of measuring may take."""
MIN_SLICE = 0.25
"""Seconds: a slice shorter than this is not started (the calls' warm-up would dominate)."""
ROUNDS_PER_CALL = 5
"""A queued call costs about this many times its price to measure (a warm-up and the rounds,
peakcut.cost.timer)."""
QUEUE_LIMIT = 20_000


class BudgetedCost:
    """CostModel over a MeasuredCostModel that never waits for a measurement (module doc)."""

    def __init__(self, measured: MeasuredCostModel, deadline: float) -> None:
        self.measured = measured
        self.deadline = deadline
        self.name = measured.name
        self.overlap_copies = measured.overlap_copies
        self._queue: dict[str, Job] = {}          # key -> how to measure it, not measured yet
        self.fitted_keys: set[str] = set()         # every key priced by the fitted prices
        self.measured_keys = 0                     # of those, measured since
        self.measuring_s = 0.0                     # seconds spent in measure_some

    @property
    def fitted(self) -> int:
        """Keys priced by the fitted prices and not measured (yet)."""
        return len(self._queue)

    def node_seconds(self, g: Graph, nid: int) -> float:
        m = self.measured
        if m.on_host(g, nid):
            return m.node_seconds(g, nid)
        key = copy_key(*swap_transfer(g, nid)) if is_swap(g, nid) else call_key(g, nid)
        if m.has(key):
            return m.node_seconds(g, nid)       # (a subclass's pricing kept)
        job = self._queue.get(key)
        if job is None:
            job = m.job(g, nid)
            if len(self._queue) < QUEUE_LIMIT:
                self._queue[key] = job
            self.fitted_keys.add(key)
        return m.fitted_seconds(job)[0]

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        m = self.measured
        key = copy_key(nbytes, direction)
        if m.has(key):
            return m.copy_seconds(nbytes, direction)
        job = self._queue.get(key) or m.copy_job(nbytes, direction)
        self._queue.setdefault(key, job)
        self.fitted_keys.add(key)
        return m.fitted_seconds(job)[0]

    def measure_some(self, seconds: float, keys: set[str] | None = None) -> int:
        """Measure queued calls (only those in `keys` when given), highest priced first, for
        about `seconds` (none started after the deadline); how many were measured."""
        t0 = time.perf_counter()
        until = min(self.deadline, t0 + seconds)
        if seconds <= 0 or t0 >= until or not self._queue:
            return 0
        pool = [j for k, j in self._queue.items() if keys is None or k in keys]
        pool.sort(key=lambda j: -self.measured.fitted_seconds(j)[0])
        chosen: list[Job] = []
        cost = 0.0
        for job in pool:
            price = ROUNDS_PER_CALL * self.measured.fitted_seconds(job)[0]
            if chosen and cost + price > seconds:
                continue
            chosen.append(job)
            cost += price
        done = self.measured.measure(chosen, until) if chosen else 0
        for job in chosen:
            if self.measured.has(job.key):
                self._queue.pop(job.key, None)
        self.measured_keys += done
        self.measuring_s += time.perf_counter() - t0
        return done

    def keys_of(self, g: Graph) -> set[str]:
        """The queued keys among the calls of `g`."""
        found = set()
        for nid in g.order:
            if not self.measured.on_host(g, nid):
                key = copy_key(*swap_transfer(g, nid)) if is_swap(g, nid) else call_key(g, nid)
                if key in self._queue:
                    found.add(key)
        return found

    def as_dict(self) -> dict[str, float | int]:
        """What the report says of the fitted prices and the measuring."""
        return {"fitted_keys": len(self.fitted_keys), "measured_since": self.measured_keys,
                "queued": self.fitted, "measuring_s": round(self.measuring_s, 3),
                "fit_points": self.measured.fit_points}


@dataclass
class MeasurePacer:
    """Calls cost.measure_some between the search's expansions (tick), so that measuring
    takes at most `duty` of the wall time since the pacer started, and none of it past
    `until` (perf_counter: the search's own deadline)."""

    cost: BudgetedCost
    duty: float = MEASURE_DUTY
    until: float = math.inf
    t0: float = field(default_factory=time.perf_counter)
    spent: float = 0.0

    def tick(self) -> None:
        now = time.perf_counter()
        allowed = min(self.duty * (now - self.t0) - self.spent, self.until - now)
        if allowed < MIN_SLICE or not self.cost.fitted:
            return
        t = time.perf_counter()
        self.cost.measure_some(allowed)
        self.spent += time.perf_counter() - t
