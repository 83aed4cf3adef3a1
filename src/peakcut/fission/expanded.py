"""What a fission expansion gives (Expanded, ExpandedRegion) and how it refuses (FissionError)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from peakcut.ir.graph import Graph
from peakcut.ir.tags import Path


class FissionError(ValueError):
    """A fission cannot be expanded exactly; the message names the node or tensor and why."""


@dataclass(frozen=True)
class ExpandedRegion:
    """One expanded region instance (a nested region has one per enclosing part)."""

    fnode: int                          # F-Tree node id
    path: Path                          # enclosing (F-Tree node, part) pairs
    label: str                          # the label of D at the region's first node
    n: int
    allocs: tuple[int, ...]             # preallocation nodes, before the parts
    parts: tuple[tuple[int, ...], ...]  # per part: its nodes in order (slices, copies, writes)
    merges: tuple[int, ...]             # merge nodes after the last part (mean, nll_mean)
    replayed: tuple[int, ...] = ()      # view nodes of S kept whole, run on the merged bases


@dataclass(frozen=True)
class Expanded:
    """A fissioned step as a plain graph and a topological order of it."""

    graph: Graph
    order: list[int]
    copies: Mapping[int, tuple[int, ...]]  # original node id -> its part copies, in order
    regions: tuple[ExpandedRegion, ...] = field(default=())
