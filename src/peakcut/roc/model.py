"""ROC's cost model of a part: per layer, a linear function of the part's features.

    seconds(part) = intercept + sum_i coefficient_i * feature_i(part) + first * [part is the first]

with the features of peakcut.roc.features summed over the part's edges; a per-part intercept
(the launches of the part's ops, the same for every part, so it does not move a balanced
split); and the first part's extra time: in the split program the first part of a sum made
out of place (``index_add``, the backward's) copies the zeros it adds into, a copy of the whole
sum the other parts do not make. The coefficients are fitted by non-negative least squares on
measured part times (a layer's parts of several splits), each column scaled to its largest
value first so that the fit does not depend on the features' units. With a handful of terms
the fit is exact by enumeration: the least-squares solution on every subset of the columns,
the best of those whose coefficients are all >= 0 (the non-negative optimum is one of them).
A vertex's or an edge's cost (costs: the model without its per-part terms, on that vertex's
or edge's features) is what the partitioner's prefix sums add up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from peakcut.roc.features import FEATURES

FloatArray = npt.NDArray[np.float64]

MAX_COLUMNS = 12
"""The most terms a fit enumerates the subsets of (4096 least-squares solves)."""


@dataclass(frozen=True)
class PartModel:
    """A fitted part-time model: seconds per unit of each feature (`names`), per part
    (`intercept`) and for the first part of a split (`first`)."""

    names: tuple[str, ...]
    coefficients: tuple[float, ...]
    intercept: float
    first: float = 0.0

    def __post_init__(self) -> None:
        if len(self.names) != len(self.coefficients):
            raise ValueError(f"PartModel: {len(self.names)} names for {len(self.coefficients)} coefficients")

    def _check(self, features: FloatArray) -> FloatArray:
        x = np.asarray(features, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.coefficients):
            raise ValueError(f"features: [rows, {len(self.coefficients)}] expected, got shape {x.shape}")
        return x

    def split_seconds(self, part_features: FloatArray) -> FloatArray:
        """Predicted seconds of each part of one split, in order ([parts, F] -> [parts])."""
        x = self._check(part_features)
        result: FloatArray = self.intercept + x @ np.asarray(self.coefficients)
        if result.shape[0]:
            result[0] += self.first
        return result

    def costs(self, features: FloatArray) -> FloatArray:
        """Each row's share of a part's time ([rows, F] -> [rows]: per vertex, EdgeFeatures.
        vertex_features; per edge, EdgeFeatures.edge_rows), the per-part terms left out."""
        x = self._check(features)
        result: FloatArray = x @ np.asarray(self.coefficients)
        return result

    def __add__(self, other: PartModel) -> PartModel:
        """The model of two layers' parts run one after the other."""
        if self.names != other.names:
            raise ValueError(f"PartModel: features {self.names} and {other.names} differ")
        return PartModel(self.names, tuple(a + b for a, b in zip(self.coefficients, other.coefficients, strict=True)),
                         self.intercept + other.intercept, self.first + other.first)

    def describe(self) -> str:
        terms = ", ".join(f"{n} {c * 1e9:.3g} ns" for n, c in zip(self.names, self.coefficients, strict=True))
        return f"{self.intercept * 1e6:.3g} us per part, {self.first * 1e6:.3g} us more for the first, {terms}"


def fit_part_model(part_features: FloatArray, seconds: Sequence[float] | FloatArray,
                   first_part: Sequence[bool] | None = None, names: Sequence[str] = FEATURES, *,
                   intercept: bool = True) -> PartModel:
    """The non-negative least-squares fit of `seconds` (one per part) on the parts' features
    ([parts, F]), with a per-part intercept unless `intercept` is False, and a first-part term
    where `first_part` marks the rows that are a split's first part."""
    x = np.asarray(part_features, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(names):
        raise ValueError(f"part_features: [parts, {len(names)}] expected, got shape {x.shape}")
    if y.shape != (x.shape[0],):
        raise ValueError(f"seconds: one per part ({x.shape[0]}) expected, got shape {y.shape}")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))) or np.any(y < 0):
        raise ValueError("part_features and seconds must be finite, seconds >= 0")
    extra = []
    if intercept:
        extra.append(np.ones(x.shape[0]))
    if first_part is not None:
        marks = np.asarray(first_part, dtype=np.float64)
        if marks.shape != y.shape:
            raise ValueError(f"first_part: one mark per part ({y.shape[0]}) expected, got shape {marks.shape}")
        extra.append(marks)
    columns = np.concatenate([np.stack(extra, axis=1), x], axis=1) if extra else x
    if columns.shape[0] < columns.shape[1]:
        raise ValueError(f"part_features: {x.shape[0]} parts cannot fit {columns.shape[1]} coefficients")
    scale = np.abs(columns).max(axis=0)
    scale[scale == 0] = 1.0
    solution = _nonnegative_least_squares(columns / scale, y) / scale
    base = float(solution[0]) if intercept else 0.0
    first = float(solution[len(extra) - 1]) if first_part is not None else 0.0
    coefficients = solution[len(extra):]
    return PartModel(tuple(names), tuple(float(c) for c in coefficients), base, first)


def _nonnegative_least_squares(a: FloatArray, y: FloatArray) -> FloatArray:
    """argmin ||a x - y|| over x >= 0, by enumerating the supports (module docstring)."""
    cols = a.shape[1]
    if cols > MAX_COLUMNS:
        raise ValueError(f"part_features: at most {MAX_COLUMNS} terms to fit, got {cols}")
    best, best_residual = np.zeros(cols), float(np.sum(y * y))
    for mask in range(1, 1 << cols):
        support = [j for j in range(cols) if mask >> j & 1]
        x, *_ = np.linalg.lstsq(a[:, support], y, rcond=None)
        if np.any(x < 0):
            continue
        residual = float(np.sum((a[:, support] @ x - y) ** 2))
        if residual < best_residual:
            best = np.zeros(cols)
            best[support] = x
            best_residual = residual
    return best


def relative_errors(predicted: FloatArray, measured: FloatArray) -> FloatArray:
    """|predicted - measured| / measured, per part."""
    p, m = np.asarray(predicted, dtype=np.float64), np.asarray(measured, dtype=np.float64)
    if p.shape != m.shape or np.any(m <= 0):
        raise ValueError(f"predicted and measured: the same shape and measured > 0, got {p.shape}, {m.shape}")
    result: FloatArray = np.abs(p - m) / m
    return result
