"""The features of ROC's cost model, per edge and per destination vertex of an edge list.

The edge list is grouped by destination (``dst`` non-decreasing; ``src`` sorted within a
group as the workloads keep it, though any order is read as it is). A part of an
aggregation is a range of edges; what it costs is modelled (peakcut.roc.model) as a linear
function of four sums over its edges, the features of Jia's thesis, Table 4.2:

- ``vertices``: the destination vertices the part adds into (1 per vertex);
- ``neighbours``: its edges, one gathered neighbour row each;
- ``runs``: its runs of consecutive neighbours (a source id one more than the one before,
  within a vertex's list), rows that lie next to each other in memory;
- ``accesses``: the memory lines (``line_bytes``) its gathered rows (``row_bytes`` each)
  touch, a run read as one contiguous block.

Each feature is kept per edge and prefix-summed, so the features of any edge range (a split
at vertex boundaries or inside a vertex's list) are two lookups and a correction at its
first edge (which starts a vertex and a run of the part).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FEATURES: tuple[str, ...] = ("vertices", "neighbours", "runs", "accesses")
"""The features' names, in column order."""

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def _as_index(values: object, name: str) -> IntArray:
    array = np.asarray(values)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"{name}: a 1-d integer array of vertex ids expected, got {array.dtype} of shape "
                         f"{array.shape}")
    return array.astype(np.int64, copy=False)


@dataclass(frozen=True)
class EdgeFeatures:
    """Per-edge feature contributions of an edge list, prefix-summed (module docstring).

    prefix[i]: the features of edges [0, i) ([E + 1, F]); at_start[i]: what a part that starts
    at edge i adds to them ([E, F]: a vertex and a run when edge i starts neither, the lines
    of a whole row instead of a run's continuation). dst: the destinations, for vertex bounds.
    """

    prefix: FloatArray
    at_start: FloatArray
    dst: IntArray
    vertices: int

    @property
    def edges(self) -> int:
        return int(self.dst.shape[0])

    def part_features(self, offsets: Sequence[int] | IntArray) -> FloatArray:
        """The features of the parts whose edge offsets are `offsets` (0, ..., E): [parts, F]."""
        off = np.asarray(offsets, dtype=np.int64)
        if off.ndim != 1 or off.shape[0] < 2 or off[0] != 0 or off[-1] != self.edges or np.any(np.diff(off) < 0):
            raise ValueError(f"offsets: non-decreasing edge offsets from 0 to {self.edges} expected, got {off}")
        sums = self.prefix[off[1:]] - self.prefix[off[:-1]]
        nonempty = off[1:] > off[:-1]
        starts = np.where(nonempty, off[:-1], 0)
        result: FloatArray = sums + self.at_start[starts] * nonempty[:, None]
        return result

    def vertex_features(self) -> FloatArray:
        """The features of each destination vertex's edges: [V, F] (zero for a vertex with no
        in-edge)."""
        off = self.vertex_offsets(np.arange(self.vertices + 1))
        return self.prefix[off[1:]] - self.prefix[off[:-1]]

    def edge_rows(self) -> FloatArray:
        """Each edge's features ([E, F]), as a part that does not start at it counts them."""
        rows: FloatArray = np.diff(self.prefix, axis=0)
        return rows

    def vertex_offsets(self, bounds: Sequence[int] | IntArray) -> IntArray:
        """The edge offset of each vertex bound (the first edge whose destination is >= it)."""
        b = np.asarray(bounds, dtype=np.int64)
        offsets: IntArray = np.searchsorted(self.dst, b, side="left").astype(np.int64)
        return offsets


def edge_features(dst: object, src: object, vertices: int, *, row_bytes: int = 4,
                  line_bytes: int = 64) -> EdgeFeatures:
    """The features of an edge list grouped by destination (module docstring): `dst`, `src`
    vertex ids per edge (numpy arrays or CPU tensors), `vertices` the number of vertices,
    `row_bytes` the bytes of one gathered row (a layer's width times its element size)."""
    d, s = _as_index(dst, "dst"), _as_index(src, "src")
    if d.shape != s.shape:
        raise ValueError(f"dst and src: one entry per edge each, got {d.shape[0]} and {s.shape[0]}")
    if vertices < 1 or row_bytes < 1 or line_bytes < 1:
        raise ValueError(f"vertices, row_bytes and line_bytes must be >= 1, got {vertices}, {row_bytes}, "
                         f"{line_bytes}")
    e = d.shape[0]
    if e and (d.min() < 0 or max(d.max(), s.max()) >= vertices or s.min() < 0):
        raise ValueError(f"dst and src: vertex ids must lie in [0, {vertices})")
    if np.any(np.diff(d) < 0):
        raise ValueError("dst: the edges must be grouped by destination (dst non-decreasing)")
    group_start = np.ones(e, dtype=bool)
    group_start[1:] = d[1:] != d[:-1]
    run_start = group_start.copy()
    run_start[1:] |= s[1:] != s[:-1] + 1
    first_line = s * row_bytes // line_bytes
    last_line = ((s + 1) * row_bytes - 1) // line_bytes
    whole = (last_line - first_line + 1).astype(np.float64)          # a row read on its own
    continued = np.empty(e, dtype=np.float64)                       # lines past the row before's
    continued[0:1] = whole[0:1]
    continued[1:] = last_line[1:] - (s[1:] * row_bytes - 1) // line_bytes
    lines = np.where(run_start, whole, continued)
    per_edge = np.stack([group_start, np.ones(e, dtype=bool), run_start], axis=1).astype(np.float64)
    per_edge = np.concatenate([per_edge, lines[:, None]], axis=1)
    prefix = np.zeros((e + 1, len(FEATURES)), dtype=np.float64)
    np.cumsum(per_edge, axis=0, out=prefix[1:])
    at_start = np.stack([~group_start, np.zeros(e, dtype=bool), ~run_start], axis=1).astype(np.float64)
    at_start = np.concatenate([at_start, (whole - lines)[:, None]], axis=1)
    return EdgeFeatures(prefix=prefix, at_start=at_start, dst=d, vertices=vertices)
