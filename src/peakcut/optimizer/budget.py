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

A search forked off the caller (peakcut.optimizer.parallel: so that the caller's process
does not keep the memory the search used) cannot time calls itself: the CPU's OpenMP threads
do not survive a fork (a parallel region in the child hangs), and its timings would not be
the caller's. Its copy of the pacer asks the caller instead (MeasurePacer.in_worker): the
calls chosen go to the caller as plain data (JobSpec), the caller measures them on its own
threads while the search waits (answer), and the entries come back into the copy's table.
At the end the copy's counts go back to the caller's pacer (handback, take).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from peakcut.cost.cache import CostEntry
from peakcut.cost.calls import call_key, copy_key, is_swap, swap_transfer
from peakcut.cost.measured import Job, JobSpec, MeasuredCostModel
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
        # in a forked search: measures the calls in the caller's process (MeasurePacer.in_worker)
        self.remote: Callable[[list[JobSpec], float], dict[str, CostEntry]] | None = None

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
        if not chosen:
            done = 0
        elif self.remote is None:
            done = self.measured.measure(chosen, until)
        else:
            done = self.measured.adopt(self.remote([self.measured.spec_of(j) for j in chosen], until))
        for job in chosen:
            if self.measured.has(job.key):
                self._queue.pop(job.key, None)
        self.measured_keys += done
        self.measuring_s += time.perf_counter() - t0
        return done

    def keys_of(self, g: Graph) -> set[str]:
        """The keys of `g`'s calls not measured yet, each queued (a forked search priced
        states whose calls this process never priced)."""
        found = set()
        for nid in g.order:
            if self.measured.on_host(g, nid):
                continue
            key = copy_key(*swap_transfer(g, nid)) if is_swap(g, nid) else call_key(g, nid)
            if self.measured.has(key):
                continue
            if key not in self._queue:
                self._queue[key] = self.measured.job(g, nid)
                self.fitted_keys.add(key)
            found.add(key)
        return found

    def answer(self, specs: list[JobSpec], until: float) -> dict[str, CostEntry]:
        """Measure a forked search's calls here (none started after `until`); their entries."""
        self.measured.measure([self.measured.job_from(s) for s in specs], min(until, self.deadline))
        return self.measured.entries_of([s.key for s in specs])

    def take(self, counts: Counts) -> None:
        """Adopt the counts of a forked copy of this model (MeasurePacer.handback); its
        measurements are in this model's table already (answer)."""
        self.fitted_keys = counts.fitted_keys
        self.measured_keys, self.measuring_s = counts.measured_keys, counts.measuring_s
        self._queue = {k: j for k, j in self._queue.items() if not self.measured.has(k)}

    def as_dict(self) -> dict[str, float | int]:
        """What the report says of the fitted prices and the measuring."""
        return {"fitted_keys": len(self.fitted_keys), "measured_since": self.measured_keys,
                "queued": self.fitted, "measuring_s": round(self.measuring_s, 3),
                "fit_points": self.measured.fit_points}


@dataclass(frozen=True)
class Counts:
    """A forked search's BudgetedCost and MeasurePacer counts, for the caller's to take."""

    fitted_keys: set[str]
    measured_keys: int
    measuring_s: float
    spent: float


@dataclass
class MeasurePacer:
    """Calls cost.measure_some between the search's expansions (tick), so that measuring
    takes at most `duty` of the wall time since the pacer started, and none of it past
    `until` (perf_counter: the search's own deadline). In a forked search (module doc) its
    copy asks the caller to measure (in_worker, answer) and hands its counts back (handback,
    take)."""

    cost: BudgetedCost
    duty: float = MEASURE_DUTY
    until: float = math.inf
    t0: float = field(default_factory=time.perf_counter)
    spent: float = 0.0

    def __post_init__(self) -> None:
        _ = self.cost.measured.line_overhead_seconds    # timed here: a forked copy times nothing itself

    def tick(self) -> None:
        now = time.perf_counter()
        allowed = min(self.duty * (now - self.t0) - self.spent, self.until - now)
        if allowed < MIN_SLICE or not self.cost.fitted:
            return
        t = time.perf_counter()
        self.cost.measure_some(allowed)
        self.spent += time.perf_counter() - t

    def in_worker(self, ask: Callable[[Any], Any]) -> None:
        """In a forked search: measure by ask((specs, until)), which the caller's pacer
        answers."""
        self.cost.remote = lambda specs, until: ask((specs, until))

    def answer(self, request: tuple[list[JobSpec], float]) -> dict[str, CostEntry]:
        """Measure a forked copy's calls (its in_worker request) here."""
        return self.cost.answer(*request)

    def handback(self) -> Counts:
        """This (forked) copy's counts, for the caller's pacer."""
        c = self.cost
        return Counts(set(c.fitted_keys), c.measured_keys, c.measuring_s, self.spent)

    def take(self, counts: Counts) -> None:
        """Adopt a forked copy's counts (its handback)."""
        self.cost.take(counts)
        self.spent = counts.spent
