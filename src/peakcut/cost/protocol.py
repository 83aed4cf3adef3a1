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
    compute stream (CPU). A model may also price the host's cost of issuing a node apart from
    the node's time on its stream (`issue_seconds(g, nid)`, see issue_seconds below).
    """

    name: str
    overlap_copies: bool

    def node_seconds(self, g: Graph, nid: int) -> float:
        """Latency of one node; for peakcut.store / load nodes, the transfer time of its bytes."""
        ...

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        """Time of copying `nbytes` bytes in `direction`: "d2h" (swap-out) or "h2d" (swap-in)."""
        ...


def issue_seconds(cost: CostModel, g: Graph, nid: int) -> float:
    """Host seconds of issuing node `nid` before its stream runs it, where the model prices
    them apart from node_seconds (an asynchronous device: AnalyticCostModel.issue_seconds); 0
    for a model that has no such method (node_seconds is then the whole call)."""
    method = getattr(cost, "issue_seconds", None)
    return float(method(g, nid)) if method is not None else 0.0
