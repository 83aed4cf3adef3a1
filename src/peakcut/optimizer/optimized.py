"""Optimized: what optimize_graph found (the search result, the eager figures, the report),
and the candidate plans worth running for real."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peakcut.codegen.arena_plan import ArenaPlan
from peakcut.cost.protocol import CostModel
from peakcut.optimizer.derive import DeriveError, Deriver
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.search import SearchResult
from peakcut.optimizer.state import State, computation_hash
from peakcut.simulate import Timeline


@dataclass
class Optimized:
    """What optimize_graph found: the search result, the eager figures and the report."""

    result: SearchResult
    objective: Objective
    report: dict[str, Any]
    cost: CostModel
    eager: Timeline          # the captured step in capture order, under `cost`
    deriver: Deriver | None = None
    eager_ratio: float = 1.0  # the user's eager step's time / the captured step's (measured)
    untransformed: State | None = None   # the captured step, where the search's root was rewritten
    arena: ArenaPlan | None = None       # the best plan's arena, where it runs with one (optimizer.arena)
    probes: dict[Any, str | None] | None = None   # the out overloads' probe verdicts the arenas used

    @property
    def captured(self) -> State:
        """The untransformed step (in its memory-aware order): the plan of last resort and the
        floor verification measures. The search's root, unless root rewrites made that."""
        return self.result.root if self.untransformed is None else self.untransformed

    @property
    def reference_s(self) -> float:
        """The seconds a latency limit is a ratio of: the user's eager step, predicted."""
        return self.eager_ratio * self.eager.latency_seconds

    def candidates(self, k: int) -> list[State]:
        """Plans worth running for real: the best, then the latest bests the limit admits as
        predicted, newest first, on their full expansion (k in all), then the root (the
        captured step, untransformed, in its memory-aware order): the plan of last resort.
        Under a latency limit the root is always a candidate, verification's reserve (timed
        where no plan meets the limit): it is eager's computation, so when run it takes about
        eager's time, even when a calibration that measured eager faster put the limit below
        its predicted time; under a memory limit only when the limit admits its predicted
        peak."""
        def ident(s: State) -> tuple[str, tuple[int, ...]]:
            return computation_hash(s.program), tuple(s.order)

        root = self.captured
        with_root = self.best is not root and (self.objective.mode == "latency"
                                               or self.objective.feasible(root.peak_bytes, root.latency_s))
        found: list[State] = [self.best]
        seen = {ident(self.best), ident(root)}
        for s in reversed(self.result.bests):
            if len(found) >= k:
                break
            if s is root or not self.objective.feasible(s.peak_bytes, s.latency_s):
                continue
            try:
                exact = self.deriver.exact(s) if self.deriver is not None else s
            except DeriveError:      # its recipes fail on the full expansion: not a candidate
                continue
            if ident(exact) not in seen:
                seen.add(ident(exact))
                found.append(exact)
        if with_root:
            found.append(root)
        return found

    @property
    def best(self) -> State:
        return self.result.best

    @property
    def feasible(self) -> bool:
        """The best meets the limit (with an arena, a memory limit by held + arena + unplanned bytes)."""
        peak = self.best.peak_bytes if self.arena is None else self.arena.needed_bytes
        return self.objective.feasible(peak, self.best.latency_s)
