"""Memory simulation of a graph in a given order.

Semantics (the same as the generated program's):
- a storage is allocated when the node that creates it runs, and freed right
  after the last node that reads any tensor living in it;
- caller-held storages (batch, parameters, buffers, optimizer state) count for
  the whole step; storages of program outputs live to the end;
- views and in-place results share their base's storage and add nothing;
- host storages (swap-outs, peakcut.store) are not device memory and count nothing;
- while a node runs, its inputs, its new outputs and its transient workspace
  are all live (Python frees an argument only after the call returns).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from peakcut.analysis.workspace import order_workspace
from peakcut.ir.graph import Graph, GraphError


@dataclass(frozen=True)
class Hotspot:
    """A storage live at the peak."""

    storage: int
    bytes: int
    tensor: str            # name of the tensor that allocated it
    module: str            # module that produced it ('' for caller-held)
    role: str
    phase: str = ""        # phase of the producing node ('' for caller-held)


@dataclass(frozen=True)
class MemoryProfile:
    """Bytes live during each step of `order`, the peak, and what is live there."""

    order: tuple[int, ...]
    timeline: np.ndarray            # bytes live while order[i] runs (int64)
    peak_bytes: int
    peak_index: int                 # position in order of the (first) peak
    baseline_bytes: int             # caller-held bytes (live all step)
    storage_lifetime: dict[int, tuple[int, int]]  # storage -> (alloc index, free index), -1/len for held
    workspace: np.ndarray           # transient workspace bytes per step
    hotspots: tuple[Hotspot, ...] = field(default=())

    @property
    def peak_node(self) -> int:
        return self.order[self.peak_index]

    def hotspots_by_module(self) -> list[tuple[str, int]]:
        """Bytes live at the peak grouped by producing module, largest first."""
        acc: dict[str, int] = {}
        for h in self.hotspots:
            key = h.module or f"<{h.phase or h.role}>"
            acc[key] = acc.get(key, 0) + h.bytes
        return sorted(acc.items(), key=lambda kv: -kv[1])


def tensor_lifetimes(g: Graph, order: list[int] | tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """Tensor id -> (index of producer, index of last reader); inputs start at -1."""
    pos = {nid: i for i, nid in enumerate(order)}
    end = len(order)
    life: dict[int, tuple[int, int]] = {t: (-1, -1) for t in g.inputs}
    for nid in order:
        for t in g.nodes[nid].output_tuple:
            life[t] = (pos[nid], pos[nid])
    for nid in order:
        for t in g.nodes[nid].input_tuple:
            start, stop = life[t]
            life[t] = (start, max(stop, pos[nid]))
    for t in g.outputs:
        life[t] = (life[t][0], end)
    return life


def simulate(g: Graph, order: list[int] | None = None, workspace: str | None = "cpu") -> MemoryProfile:
    """Simulate `order` (default: capture order); workspace 'cpu' models CPU scratch, None ignores it."""
    order_t = tuple(g.order if order is None else order)
    if len(order_t) != len(g.nodes):
        raise GraphError(f"order has {len(order_t)} nodes, graph has {len(g.nodes)}")
    n = len(order_t)
    held = g.caller_held_storages()
    outs = g.output_storages()
    host = g.host_storages()

    alloc: dict[int, int] = {}
    free: dict[int, int] = {}
    nodes = g.nodes
    tensors = g.tensors
    for i, nid in enumerate(order_t):
        node = nodes[nid]
        for t in node.output_tuple:
            s = tensors[t].storage
            if s not in held and s not in alloc and s not in host:
                alloc[s] = i
                free[s] = i
        for t in node.input_tuple:
            s = tensors[t].storage
            f = free.get(s)
            if f is not None and f < i:
                free[s] = i
    for s in outs:
        if s in free:
            free[s] = n - 1

    delta = np.zeros(n + 1, dtype=np.int64)
    if alloc:
        sizes = np.fromiter((g.storages[s] for s in alloc), dtype=np.int64, count=len(alloc))
        np.add.at(delta, np.fromiter(alloc.values(), dtype=np.int64, count=len(alloc)), sizes)
        np.subtract.at(delta, np.fromiter((free[s] + 1 for s in alloc), dtype=np.int64,
                                          count=len(alloc)), sizes)
    baseline = sum(g.storages[s] for s in held)
    ws = np.zeros(n, dtype=np.int64) if workspace is None else order_workspace(g, order_t, workspace)
    timeline = np.cumsum(delta[:n]) + baseline + ws
    peak_index = int(np.argmax(timeline)) if n else 0
    peak = int(timeline[peak_index]) if n else baseline

    lifetime = {s: (alloc[s], free[s]) for s in alloc}
    lifetime.update({s: (-1, n) for s in held})
    owner_tensor = _owner_tensors(g, order_t, held)
    hot = []
    for s, (a, f) in lifetime.items():
        if a <= peak_index <= f:
            t = owner_tensor.get(s)
            meta = g.tensors[t] if t is not None else None
            prod = g.producer(t) if t is not None else None
            hot.append(Hotspot(
                storage=s, bytes=g.storages[s], tensor=meta.name if meta else str(s),
                module=g.nodes[prod].module if prod is not None else "",
                role=meta.role.value if meta else "",
                phase=g.nodes[prod].phase.value if prod is not None else "",
            ))
    hot.sort(key=lambda h: -h.bytes)
    return MemoryProfile(order_t, timeline, peak, peak_index, baseline, lifetime, ws, tuple(hot))


def _owner_tensors(g: Graph, order: tuple[int, ...], held: set[int]) -> dict[int, int]:
    owner: dict[int, int] = {}
    for t in g.inputs:
        owner.setdefault(g.tensors[t].storage, t)
    nodes = g.nodes
    tensors = g.tensors
    for nid in order:
        for t in nodes[nid].output_tuple:
            owner.setdefault(tensors[t].storage, t)
    return owner
