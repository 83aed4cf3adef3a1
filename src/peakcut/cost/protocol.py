"""The one interface of peakcut's latency models (structural: any matching class works).

Kept free of heavy imports so that the simulator and the scheduler can depend on it.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from peakcut.ir.graph import Graph


@runtime_checkable
class CostModel(Protocol):
    """Latency of graph nodes and of host<->device copies on one device.

    name: e.g. "analytic:h200", "measured:cpu". overlap_copies: True when swap copies run on
    their own copy streams concurrently with compute (GPU); False when they run inline on the
    compute stream (CPU).
    """

    name: str
    overlap_copies: bool

    def node_seconds(self, g: Graph, nid: int) -> float:
        """Latency of one node; for peakcut.store / load nodes, the transfer time of its bytes."""
        ...

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        """Time of copying `nbytes` bytes in `direction`: "d2h" (swap-out) or "h2d" (swap-in)."""
        ...
