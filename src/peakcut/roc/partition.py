"""ROC's partitioner: consecutive vertex ranges of balanced predicted cost.

Given each destination vertex's predicted cost (PartModel.vertex_costs), the prefix sums
P[i] = cost of vertices [0, i) are computed once, and the k-th of the n - 1 split points is
found by binary search (numpy.searchsorted) for k / n of the total, taking the nearer of the
two vertices around it (a first part's extra time, PartModel.first, counts before vertex 0); a split point that would leave a part without an edge moves to the
next vertex that gives it one. The parts are vertex ranges, so a boundary vertex is never
shared; their edge offsets (EdgeFeatures.vertex_offsets) are what
peakcut.transform.vertex_ranges takes as ``boundaries``.

balanced_edge_split does the same over edges (the prefix sums of each edge's predicted cost),
so a part may end inside a vertex's list, as the vertex-range rewrite's parts may: a vertex
with more edges than a part's share (a hub) no longer sets the balance.

The splits it is compared with: equal vertex ranges (``k V / n``) and equal edge ranges
(``k E / n``, the vertex-range rewrite's default, whose boundary vertices are shared by two
parts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from peakcut.roc.features import EdgeFeatures

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Split:
    """A split of an edge list into parts: its name, its vertex bounds (parts + 1, or None for
    a split inside vertices' lists) and its edge offsets (parts + 1, 0 to E)."""

    name: str
    vertex_bounds: IntArray | None
    offsets: IntArray

    @property
    def parts(self) -> int:
        return int(self.offsets.shape[0]) - 1


def _check_parts(parts: int, edges: int) -> None:
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    if parts > edges:
        raise ValueError(f"parts={parts}: more parts than the {edges} edges")


def split_points(costs: FloatArray, parts: int, first: float = 0.0) -> IntArray:
    """The vertex bounds (0, n - 1 split points, V) that balance the prefix sums of `costs`
    (one per vertex, >= 0) into `parts` ranges, by binary search (module docstring); `first`:
    what the first part costs on top of its vertices."""
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim != 1 or c.shape[0] < 1 or np.any(c < 0) or not np.all(np.isfinite(c)):
        raise ValueError("costs: a non-empty 1-d array of finite costs >= 0 expected")
    if parts < 1 or first < 0:
        raise ValueError(f"parts must be >= 1 and first >= 0, got {parts} and {first}")
    prefix = np.concatenate([[0.0], np.cumsum(c)])
    targets = (prefix[-1] + first) * np.arange(1, parts) / parts - first
    right = np.clip(np.searchsorted(prefix, targets, side="left"), 1, c.shape[0])
    left = right - 1
    nearer = np.where(targets - prefix[left] <= prefix[right] - targets, left, right)
    bounds: IntArray = np.concatenate([[0], nearer, [c.shape[0]]]).astype(np.int64)
    return bounds


def _edge_bearing(features: EdgeFeatures, bounds: IntArray) -> IntArray:
    """`bounds` moved forward where needed so that every part has an edge."""
    starts = np.unique(features.dst)              # the vertices with an in-edge, in order
    parts = bounds.shape[0] - 1
    if starts.shape[0] < parts:
        raise ValueError(f"parts={parts}: only {starts.shape[0]} vertices have an in-edge, one per part needed")
    fixed = bounds.copy()
    for k in range(1, parts):
        # part k - 1 needs an edge-bearing vertex in [fixed[k-1], fixed[k]); parts k.. need parts - k after
        first = int(np.searchsorted(starts, fixed[k - 1], side="left"))
        low = int(starts[first]) + 1
        high = int(starts[starts.shape[0] - (parts - k)])
        fixed[k] = min(max(fixed[k], low), high)
    return fixed


def vertex_split(features: EdgeFeatures, bounds: IntArray, name: str) -> Split:
    """The split at vertex `bounds` (0, ..., V; moved where a part would have no edge)."""
    b = np.asarray(bounds, dtype=np.int64)
    v = features.vertices
    if b.ndim != 1 or b.shape[0] < 2 or b[0] != 0 or b[-1] != v or np.any(np.diff(b) < 0):
        raise ValueError(f"bounds: non-decreasing vertex bounds from 0 to {v} expected, got {b}")
    _check_parts(b.shape[0] - 1, features.edges)
    fixed = _edge_bearing(features, b)
    return Split(name, fixed, features.vertex_offsets(fixed))


def balanced_split(features: EdgeFeatures, costs: FloatArray, parts: int, first: float = 0.0,
                   name: str = "partitioner") -> Split:
    """ROC's split: vertex ranges of balanced predicted cost (`costs`, one per vertex; `first`,
    the first part's extra)."""
    _check_parts(parts, features.edges)
    if np.asarray(costs).shape != (features.vertices,):
        raise ValueError(f"costs: one per vertex ({features.vertices}) expected, got shape {np.asarray(costs).shape}")
    return vertex_split(features, split_points(costs, parts, first), name)


def balanced_edge_split(features: EdgeFeatures, costs: FloatArray, parts: int, first: float = 0.0,
                        name: str = "partitioner, edge ranges") -> Split:
    """Edge ranges of balanced predicted cost (`costs`, one per edge; `first`, the first part's
    extra), every part at least one edge."""
    _check_parts(parts, features.edges)
    e = features.edges
    if np.asarray(costs).shape != (e,):
        raise ValueError(f"costs: one per edge ({e}) expected, got shape {np.asarray(costs).shape}")
    offsets = split_points(costs, parts, first)
    for k in range(1, parts):
        offsets[k] = min(max(offsets[k], offsets[k - 1] + 1), e - (parts - k))
    return Split(name, None, offsets)


def equal_vertex_split(features: EdgeFeatures, parts: int) -> Split:
    """k V / n: vertex ranges of equal length (moved where a part would have no edge)."""
    _check_parts(parts, features.edges)
    v = features.vertices
    return vertex_split(features, np.array([k * v // parts for k in range(parts + 1)], dtype=np.int64),
                        "equal vertices")


def equal_edge_split(features: EdgeFeatures, parts: int) -> Split:
    """k E / n: the vertex-range rewrite's default edge ranges."""
    _check_parts(parts, features.edges)
    e = features.edges
    return Split("equal edges", None, np.array([k * e // parts for k in range(parts + 1)], dtype=np.int64))
