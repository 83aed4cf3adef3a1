"""The search's swaps against ROC's memory manager (the exact DP) on small per-part graphs.

    python -m bench.roc_memory            # the table (markdown) on stdout

For each case (a tiny GNN part after vertex-range fission and small synthetic graphs, each at
most peakcut.roc.memory_manager.MAX_OPS ops besides views, captured over FakeTensors in
inference) and each capacity between the memory floor and the capture order's peak, the DP
(peakcut.roc.plan_cache) finds the least bytes moved between host and device, and the search
(optimize_graph with swaps as its only moves, memory_limit = the capacity, a fixed number of
states, no clock) finds a plan whose swap nodes move host_traffic(plan) bytes. Both sides
count the same: no workspace, copies in turn with compute (the H100 analytic profile with
copies that do not overlap compute: a swap's load runs right before its reader, as the DP's
does), program inputs on the device all step. All figures are simulated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import nn

import peakcut
from peakcut.cost.analytic import AnalyticCostModel
from peakcut.cost.profiles import H100
from peakcut.ir.graph import Graph
from peakcut.ir.registry import OpKind, lookup
from peakcut.memory.liveness import storage_touches
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import MoveSettings
from peakcut.roc.memory_manager import host_traffic, plan_cache
from peakcut.schedule.problem import Problem
from peakcut.transform.vertex_ranges import find_edge_chains, split_edge_chains
from peakcut.workloads.gnn import size_of
from peakcut.workloads.graphs import synthetic_graph

IN_ORDER = AnalyticCostModel(replace(H100, name="h100-in-order", overlap_copies=False, asynchronous=False))
"""The H100 profile with copies that do not overlap compute (each copy runs in turn)."""

MAX_STATES = 40
FRACTIONS = (0.0, 0.25, 0.5, 0.75)
"""Capacities: floor + f x (capture-order peak - floor)."""


class ChainSkip(nn.Module):
    """x -> wide a -> three element-wise ops -> narrow c; the end reads a again (c^T a)."""

    def __init__(self, width: int = 64, wide: int = 512) -> None:
        super().__init__()
        self.up = nn.Linear(width, wide, bias=False)
        self.down = nn.Linear(wide, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.up(x)
        c = self.down(torch.tanh(torch.exp(torch.sin(a))))
        return torch.mm(c.t(), a).sum()


class TwoSkips(nn.Module):
    """A wide a and a narrower b both read again at the end, past a chain on b: which to swap
    depends on the capacity."""

    def __init__(self, width: int = 64, wide: int = 512, mid: int = 256) -> None:
        super().__init__()
        self.up = nn.Linear(width, wide, bias=False)
        self.mid = nn.Linear(wide, mid, bias=False)
        self.down = nn.Linear(mid, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.up(x)
        b = self.mid(a)
        c = self.down(torch.tanh(torch.exp(torch.sin(b))))
        return torch.mm(c.t(), a).sum() + torch.mm(c.t(), b).sum()


class Diamond(nn.Module):
    """Two wide branches from one input joined at the end, a skip around them."""

    def __init__(self, width: int = 64, wide: int = 512) -> None:
        super().__init__()
        self.up = nn.Linear(width, wide, bias=False)
        self.left = nn.Linear(wide, wide, bias=False)
        self.right = nn.Linear(wide, wide, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.up(x)
        b = torch.relu(self.left(a))
        c = torch.sigmoid(self.right(a))
        return (b * c + a).sum()


class GcnPart(nn.Module):
    """One GCN layer's aggregation with its self term: z = h W; messages z[src] * w summed
    per destination, plus z * self_weight; ReLU."""

    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.lin = nn.Linear(features, hidden, bias=False)

    def forward(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, w: torch.Tensor,
                self_w: torch.Tensor) -> torch.Tensor:
        z = self.lin(h)
        messages = z.index_select(0, src) * w.unsqueeze(1)
        out = messages.new_zeros(z.shape).index_add_(0, dst, messages)
        return torch.relu(out + z * self_w.unsqueeze(1))


def chain_skip() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(ChainSkip(), (torch.randn(256, 64),))


def two_skips() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(TwoSkips(), (torch.randn(256, 64),))


def diamond() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(Diamond(), (torch.randn(256, 64),))


def gcn_part(parts: int = 2) -> Graph:
    """The tiny Reddit GCN's aggregation (workloads.gnn at size tiny, hidden 64 so that its
    per-edge messages dominate), its edge chain split into `parts` vertex ranges."""
    size = size_of("reddit", "tiny")
    graph = synthetic_graph(size.graph)
    torch.manual_seed(0)
    v, e = size.graph.vertices, size.graph.edges
    g = peakcut.capture(GcnPart(size.graph.features, 64),
                        (graph.x, graph.src, graph.dst, torch.rand(e), torch.rand(v)))
    rewrite, reasons = split_edge_chains(g, g.order, find_edge_chains(g), parts)
    if rewrite is None:
        raise RuntimeError(f"the GCN part did not split: {reasons}")
    return rewrite.graph.with_order(rewrite.order)


CASES: dict[str, Callable[[], Graph]] = {"gcn-part (2 vertex ranges)": gcn_part, "chain-skip": chain_skip,
                                         "two-skips": two_skips, "diamond": diamond}


def floor_bytes(g: Graph) -> int:
    """The least capacity any program can meet: the held bytes and the storages of the node
    that touches the most."""
    touches = storage_touches(g, list(g.order))
    per_node: dict[int, set[int]] = {}
    for k, v in zip(touches.touch_storage.tolist(), touches.touch_node.tolist(), strict=True):
        per_node.setdefault(v, set()).add(k)
    most = max((sum(int(touches.size[k]) for k in ks) for ks in per_node.values()), default=0)
    return int(touches.baseline) + most


def ops_of(g: Graph) -> int:
    """The graph's nodes that are not views (what MAX_OPS bounds)."""
    return sum(1 for n in g.nodes.values() if not ((info := lookup(n.op)) is not None and info.kind is OpKind.VIEW))


def order_peak(g: Graph) -> int:
    """The capture order's peak (no workspace): the untransformed step's."""
    return Problem(g, workspace=None).peak(list(range(len(g.order))))


@dataclass(frozen=True)
class Row:
    """One case at one capacity: the DP's bytes, the search's and whether it met the limit."""

    case: str
    ops: int
    capacity: int
    peak: int
    floor: int
    dp_bytes: int
    search_bytes: int
    search_peak: int
    feasible: bool

    @property
    def ratio(self) -> float:
        if self.dp_bytes == 0:
            return 1.0 if self.search_bytes == 0 else math.inf
        return self.search_bytes / self.dp_bytes


def search_bytes(g: Graph, capacity: int, max_states: int = MAX_STATES) -> tuple[int, int, bool]:
    """(bytes the search's plan moves, its peak, whether it meets `capacity`)."""
    o = optimize_graph(g, memory_limit=capacity, time_budget=1e6, max_states=max_states, device=IN_ORDER,
                       settings=MoveSettings.only("swap"), workspace=None)
    return host_traffic(o.result.best.program), o.report["peak_bytes"], bool(o.report["feasible"])


def rows(cases: dict[str, Callable[[], Graph]] | None = None, fractions: tuple[float, ...] = FRACTIONS,
         max_states: int = MAX_STATES) -> list[Row]:
    out = []
    for name, build in (cases or CASES).items():
        g = build()
        peak, floor, ops = order_peak(g), floor_bytes(g), ops_of(g)
        for f in fractions:
            capacity = int(floor + f * (peak - floor))
            dp = plan_cache(g, capacity)
            moved, got, ok = search_bytes(g, capacity, max_states)
            out.append(Row(name, ops, capacity, peak, floor, dp.moved_bytes, moved, got, ok))
    return out


def _kib(n: int) -> str:
    return f"{n / 1024:.2f}".rstrip("0").rstrip(".")


def table(found: list[Row]) -> str:
    lines = ["| case | ops | capacity KiB (floor, peak) | DP bytes KiB | search bytes KiB | ratio | search peak KiB |",
             "|---|---|---|---|---|---|---|"]
    for r in found:
        ratio = ("limit not met" if not r.feasible else "-" if r.dp_bytes == 0 and r.search_bytes == 0
                 else f"{r.ratio:.2f}")
        lines.append(f"| {r.case} | {r.ops} | {_kib(r.capacity)} ({_kib(r.floor)}, {_kib(r.peak)}) | "
                     f"{_kib(r.dp_bytes)} | {_kib(r.search_bytes)} | {ratio} | {_kib(r.search_peak)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(rows()))
