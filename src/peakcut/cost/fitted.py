"""Prices of calls not measured yet, fitted to the measured calls of the same family.

    fit = FittedPrices()
    fit.add(work, seconds)                   # a measured call
    seconds, how = fit.price(work)           # a call not measured yet

A family is an op overload and the dtype it computes in (``aten.mm.default:float32``; a
host copy's family is its direction). With more measured calls in a family than terms, its
price is ``a + b x FLOPs + c x bytes`` fitted by least squares on relative errors (each point
weighted by 1 / its seconds, so that a 10 us call counts as much as a 10 ms one) with a, b,
c >= 0: every subset of the terms is fitted and the one with the least error and no negative
coefficient is kept. Otherwise, or where it fits the family's points worse, the price is
the analytic profile's estimate of the call scaled by the median of measured / analytic
over the family's points, or over every point when the family has none (with no point at
all: the analytic estimate as is). Fits are made again lazily, after new points.

A call beyond the points' reach (more than REACH times their largest FLOPs or bytes, or
their largest analytic estimate) is priced by the analytic estimate scaled by a ratio of
measured / analytic taken near its size: at the family's largest points where the call is
within FAMILY_NEAR times their analytic estimate and they are nearer to it than every
family's largest points, else at those (host copies aside). A line fitted to small calls
says little about one a thousand times larger (launch-bound 1 KFLOP addmm calls extrapolated
to a 24 GFLOP one give minutes); it is kept beyond its reach only where it agrees with that
price within AGREE times. A host copy's line (a latency plus bytes over a bandwidth) and a
call without an analytic estimate keep their family's fit at any size. Prices may step at
the reach where the fit and the ratio disagree (within AGREE).
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

import numpy as np

MIN_SECONDS = 1e-7
"""The least price a fit gives (a call is never free)."""
REACH = 2.0
"""How far beyond its points' largest FLOPs, bytes and analytic estimate a family's fit prices."""
AGREE = 4.0
"""Beyond its reach, a linear fit is kept where it is within this factor of the scaled price."""
COPY_FAMILY = "copy:"
"""A host copy's family: its direction."""
FAMILY_NEAR = 16.0
"""Beyond its reach, a family's own ratio may price a call within this factor of its largest
points' analytic estimate (where they are the nearest points); farther, every family's."""


@dataclass(frozen=True)
class Work:
    """What a fit reads of one call: its family, FLOPs, bytes moved and the analytic estimate."""

    family: str
    flops: float
    bytes: float
    analytic: float

    def as_list(self) -> list[str | float]:
        return [self.family, self.flops, self.bytes, self.analytic]


@dataclass(frozen=True)
class _Largest:
    """Measured / analytic at the largest points (those within half the largest analytic
    estimate), and that estimate."""

    ratio: float
    analytic: float

    @staticmethod
    def of(points: list[tuple[Work, float]]) -> _Largest | None:
        measured = _ratios(points)
        if not measured:
            return None
        top = max(a for a, _ in measured)
        return _Largest(statistics.median(r for a, r in measured if a >= top / 2), top)

    def distance(self, analytic: float) -> float:
        return abs(math.log(max(analytic, MIN_SECONDS) / self.analytic))


@dataclass(frozen=True)
class _Fit:
    """One family's price: linear coefficients (a, b, c) or, when None, analytic x scale;
    `reach` the largest FLOPs, bytes and analytic estimate of its points."""

    coef: tuple[float, float, float] | None
    scale: float
    reach: tuple[float, float, float] = (math.inf, math.inf, math.inf)
    largest: _Largest | None = None

    def seconds(self, work: Work) -> float:
        if self.coef is None:
            return max(MIN_SECONDS, work.analytic * self.scale)
        a, b, c = self.coef
        return max(MIN_SECONDS, a + b * work.flops + c * work.bytes)

    def within_reach(self, work: Work) -> bool:
        flops, nbytes, analytic = self.reach
        return work.flops <= REACH * flops and work.bytes <= REACH * nbytes and work.analytic <= REACH * analytic


def _scalable(work: Work) -> bool:
    """Whether a call beyond its family's reach is priced by a measured ratio: it has an
    analytic estimate to scale, and is not a host copy (a copy's line, a latency plus bytes
    over a bandwidth, holds at any size)."""
    return work.analytic > 0 and not work.family.startswith(COPY_FAMILY)


def _ratios(points: list[tuple[Work, float]]) -> list[tuple[float, float]]:
    """(analytic estimate, measured / analytic) of the points that have both."""
    return [(w.analytic, s / w.analytic) for w, s in points if w.analytic > 0 and s > 0]


def _ratio_scale(points: list[tuple[Work, float]]) -> float | None:
    ratios = [r for _, r in _ratios(points)]
    return statistics.median(ratios) if ratios else None


def _relative_error(fit: _Fit, points: list[tuple[Work, float]]) -> float:
    return float(np.mean([((fit.seconds(w) - s) / s) ** 2 for w, s in points]))


def _linear(points: list[tuple[Work, float]]) -> tuple[float, float, float] | None:
    """The least-squares (a, b, c) >= 0 on relative errors with the least error, or None."""
    y = np.array([s for _, s in points], dtype=np.float64)
    x = np.array([[1.0, w.flops, w.bytes] for w, _ in points], dtype=np.float64)
    weight = 1.0 / y
    best: tuple[float, tuple[float, float, float]] | None = None
    for size in (1, 2, 3):
        if len(points) <= size:
            break
        for cols in itertools.combinations(range(3), size):
            a = x[:, cols] * weight[:, None]
            if np.linalg.matrix_rank(a) < size:
                continue
            sol, *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
            if (sol < 0).any():
                continue
            coef = [0.0, 0.0, 0.0]
            for col, value in zip(cols, sol, strict=True):
                coef[col] = float(value)
            error = float(np.sum((a @ sol - 1.0) ** 2))
            if best is None or error < best[0]:
                best = (error, (coef[0], coef[1], coef[2]))
    return None if best is None else best[1]


class FittedPrices:
    """Measured calls by family, and the price of a call from them (module doc)."""

    def __init__(self) -> None:
        self._points: dict[str, list[tuple[Work, float]]] = {}
        self._fits: dict[str, _Fit] = {}
        self._scale: float | None = None     # every point's median measured / analytic
        self._largest: _Largest | None = None   # every family's largest points (host copies' aside)
        self._largest_known = False
        self.points = 0

    def add(self, work: Work, seconds: float) -> None:
        """A measured call: `seconds` of a call doing `work`."""
        if not seconds > 0:
            return
        self._points.setdefault(work.family, []).append((work, seconds))
        self._fits.pop(work.family, None)
        self._scale = None
        self._largest_known = False
        self.points += 1

    def price(self, work: Work) -> tuple[float, str]:
        """Seconds of a call doing `work`, and how they were found: "fitted" (the family's
        linear fit), "scaled" (analytic x the family's or every family's measured ratio) or
        "analytic" (no point yet)."""
        fit = self._fit(work.family)
        if fit is not None and (fit.within_reach(work) or not _scalable(work)):
            return fit.seconds(work), "fitted" if fit.coef is not None else "scaled"
        scale = self._global_scale()
        if scale is None:
            return max(MIN_SECONDS, work.analytic), "analytic"
        largest = self._global_largest()
        if fit is None and (largest is None or work.analytic <= REACH * largest.analytic):
            return max(MIN_SECONDS, work.analytic * scale), "scaled"
        options = [x for x in (fit.largest if fit is not None else None,)
                   if x is not None and x.distance(work.analytic) <= math.log(FAMILY_NEAR)]
        options += [largest] if largest is not None else []
        ratio = min(options, key=lambda x: x.distance(work.analytic)).ratio if options else scale
        scaled = max(MIN_SECONDS, work.analytic * ratio)
        if fit is not None and fit.coef is not None and scaled / AGREE <= fit.seconds(work) <= scaled * AGREE:
            return fit.seconds(work), "fitted"
        return scaled, "scaled"

    def _global_scale(self) -> float | None:
        if self._scale is None and self.points:
            self._scale = _ratio_scale([p for family in self._points.values() for p in family])
        return self._scale

    def _global_largest(self) -> _Largest | None:
        """Every family's largest points but host copies' (whose lines hold at any size)."""
        if not self._largest_known:
            self._largest = _Largest.of([p for family, points in self._points.items()
                                         if not family.startswith(COPY_FAMILY) for p in points])
            self._largest_known = True
        return self._largest

    def _fit(self, family: str) -> _Fit | None:
        fit = self._fits.get(family)
        if fit is not None:
            return fit
        points = self._points.get(family)
        if not points:
            return None
        scale = _ratio_scale(points)
        reach = (max(w.flops for w, _ in points), max(w.bytes for w, _ in points), max(w.analytic for w, _ in points))
        scaled = _Fit(None, scale if scale is not None else (self._global_scale() or 1.0), reach, _Largest.of(points))
        coef = _linear(points)
        fit = scaled
        if coef is not None:
            linear = _Fit(coef, scaled.scale, reach, scaled.largest)
            if _relative_error(linear, points) <= _relative_error(scaled, points):
                fit = linear
        self._fits[family] = fit
        return fit
