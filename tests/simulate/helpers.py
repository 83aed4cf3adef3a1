"""Test helpers for the timeline simulator: a fake cost model, random orders, hand-built graphs, swaps."""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Callable

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase, TensorRef, map_refs
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.tensor import Role, TensorMeta


@dataclasses.dataclass
class FakeCost:
    """A CostModel: `seconds(g, nid)` for every node, or `copy` seconds for stores and loads."""

    seconds: Callable[[Graph, int], float]
    overlap_copies: bool = True
    copy: float = 3.0
    name: str = "fake"

    def node_seconds(self, g: Graph, nid: int) -> float:
        if g.nodes[nid].op in (STORE_OP, LOAD_OP):
            return self.copy
        return self.seconds(g, nid)

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        return self.copy


def constant(value: float) -> Callable[[Graph, int], float]:
    return lambda g, nid: value


def random_seconds(seed: int, zero_share: float = 0.3) -> Callable[[Graph, int], float]:
    """Per-node latencies drawn once per node id: a share of them zero (like views)."""
    rng = random.Random(seed)
    table: dict[int, float] = {}

    def seconds(g: Graph, nid: int) -> float:
        if nid not in table:
            table[nid] = 0.0 if rng.random() < zero_share else rng.choice([1e-3, 0.5, 1.0, 2.5])
        return table[nid]

    return seconds


def random_topological_order(g: Graph, seed: int) -> list[int]:
    """Kahn's algorithm with random tie-breaking among ready nodes."""
    rng = random.Random(seed)
    preds = {nid: g.predecessors(nid) for nid in g.nodes}
    succs: dict[int, list[int]] = {nid: [] for nid in g.nodes}
    for nid, ps in preds.items():
        for p in ps:
            succs[p].append(nid)
    waiting = {nid: len(ps) for nid, ps in preds.items()}
    ready = [(rng.random(), nid) for nid, k in waiting.items() if k == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, nid = heapq.heappop(ready)
        order.append(nid)
        for s in succs[nid]:
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, (rng.random(), s))
    return order


class GraphBuilder:
    """A float32 graph built op by op; every op output gets a new storage."""

    def __init__(self) -> None:
        self.g = Graph(tensors={}, nodes={}, inputs=[], input_names=[], outputs=[],
                       output_names=[], storages={}, order=[], control={})
        self._next = 1

    def _id(self) -> int:
        self._next += 1
        return self._next

    def _tensor(self, shape: tuple[int, ...], role: Role, name: str) -> int:
        tid, sid = self._id(), self._id()
        stride = tuple(int(s) for s in torch.empty(shape, device="meta").stride())
        meta = TensorMeta(tid, shape, stride, "float32", sid, 0, role, name)
        self.g.tensors[tid] = meta
        self.g.storages[sid] = meta.nbytes
        return tid

    def input(self, name: str, shape: tuple[int, ...]) -> int:
        t = self._tensor(shape, Role.INPUT, name)
        self.g.inputs.append(t)
        self.g.input_names.append(f"batch:{len(self.g.inputs) - 1}")
        return t

    def op(self, op: str, *args: int, shape: tuple[int, ...], name: str) -> int:
        """Append node `op(*args)` with one output of `shape`; returns the output tensor id."""
        out = self._tensor(shape, Role.ACTIVATION, name)
        nid = self._id()
        self.g.add_node(Node(nid, op, tuple(TensorRef(a) for a in args), {}, (out,), name=name,
                             phase=Phase.FORWARD))
        self.g.order.append(nid)
        return out

    def output(self, t: int) -> None:
        self.g.outputs.append(t)
        self.g.output_names.append(f"out:{len(self.g.outputs) - 1}")


def insert_swap(g: Graph, tensor: int, store_after: int, load_before: int,
                users: list[int]) -> tuple[int, int]:
    """Swap `tensor` out after node `store_after`, back in before `load_before`; `users` read the copy.

    Returns (store node id, load node id). The graph is checked afterwards.
    """
    meta = g.tensors[tensor]
    nbytes = g.storages[meta.storage]
    first = g.next_id()
    host_t, store_id, back_t, load_id = range(first, first + 4)
    host_s, back_s = max(g.storages) + 1, max(g.storages) + 2
    g.storages[host_s] = nbytes
    g.storages[back_s] = nbytes
    host = TensorMeta(host_t, meta.shape, meta.stride, meta.dtype, host_s, meta.storage_offset,
                      Role.ACTIVATION, f"{meta.name}.host")
    back = TensorMeta(back_t, meta.shape, meta.stride, meta.dtype, back_s, meta.storage_offset,
                      Role.ACTIVATION, f"{meta.name}.loaded")
    g.add_node(Node(store_id, STORE_OP, (TensorRef(tensor),), {}, (host_t,),
                    name=f"store_{meta.name}"), [host])
    g.add_node(Node(load_id, LOAD_OP, (TensorRef(host_t),), {"device": torch.device(g.device)},
                    (back_t,), name=f"load_{meta.name}"), [back])

    def reroute(ref: TensorRef) -> TensorRef:
        return TensorRef(back_t) if ref.id == tensor else ref

    for nid in users:
        n = g.nodes[nid]
        g.nodes[nid] = dataclasses.replace(n, args=map_refs(n.args, reroute),
                                           kwargs=map_refs(n.kwargs, reroute))
    g._invalidate()
    order = list(g.order)
    order.insert(order.index(store_after) + 1, store_id)
    order.insert(order.index(load_before), load_id)
    g.order = order
    g.check()
    return store_id, load_id


def swap_chain(between: int = 6, numel: int = 1024) -> tuple[Graph, int, int, int]:
    """a = exp(x); a chain of `between` sin nodes on y; dot(a, chain end). Returns (g, a, exp, dot)."""
    b = GraphBuilder()
    x = b.input("x", (numel,))
    y = b.input("y", (numel,))
    a = b.op("aten.exp.default", x, shape=(numel,), name="a")
    h = y
    for i in range(between):
        h = b.op("aten.sin.default", h, shape=(numel,), name=f"h{i}")
    out = b.op("aten.dot.default", a, h, shape=(), name="out")
    b.output(out)
    b.g.check()
    return b.g, a, b.g.producer(a), b.g.producer(out)
