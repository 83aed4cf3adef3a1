"""What the timeline simulator needs from a cost model (structural: any matching class works)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from peakcut.ir.graph import Graph


@runtime_checkable
class CostModel(Protocol):
    """Latency of graph nodes on one device.

    name: a label for reports. overlap_copies: True when swap copies
    (peakcut.store / peakcut.load) run on their own copy streams and can overlap
    compute (a GPU); False when they run inline on the compute stream (a CPU).
    """

    name: str
    overlap_copies: bool

    def node_seconds(self, g: Graph, nid: int) -> float:
        """Seconds node `nid` takes; for a store or load, the transfer time."""
        ...
