"""Test helpers for the timeline simulator: a fake cost model, random orders, hand-built graphs, swaps."""

from __future__ import annotations

import dataclasses
import heapq
import random
from collections.abc import Callable

import torch

from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase, TensorRef, map_refs
from peakcut.ir.ops import COPY_DIRECTION, LOAD_OP, STORE_OP
from peakcut.ir.tags import NodeTags, SwapTag
from peakcut.ir.tensor import Role, TensorMeta


@dataclasses.dataclass
class FakeCost:
    """A CostModel: `seconds(g, nid)` for every node, or `copy` seconds for host copies (stores,
    loads, writebacks)."""

    seconds: Callable[[Graph, int], float]
    overlap_copies: bool = True
    copy: float = 3.0
    name: str = "fake"

    def node_seconds(self, g: Graph, nid: int) -> float:
        if g.nodes[nid].op in COPY_DIRECTION:
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
        empty = Graph(tensors={}, nodes={}, inputs=[], input_names=[], outputs=[],
                      output_names=[], storages={}, order=[], control={})
        self._edit = GraphEditor(empty, next_id=2)

    @property
    def g(self) -> Graph:
        """The graph built so far (the same object while it grows)."""
        return self._edit.graph

    def _tensor(self, shape: tuple[int, ...], role: Role, name: str) -> TensorMeta:
        tid = self._edit.new_id()
        stride = tuple(int(s) for s in torch.empty(shape, device="meta").stride())
        nbytes = TensorMeta(tid, shape, stride, "float32", -1, 0, role, name).nbytes
        return TensorMeta(tid, shape, stride, "float32", self._edit.add_storage(nbytes), 0, role, name)

    def input(self, name: str, shape: tuple[int, ...]) -> int:
        meta = self._tensor(shape, Role.INPUT, name)
        self._edit.set_tensor(meta)
        self._edit.set_interface(inputs=[*self.g.inputs, meta.id],
                                 input_names=[*self.g.input_names, f"batch:{len(self.g.inputs)}"])
        return meta.id

    def op(self, op: str, *args: int, shape: tuple[int, ...], name: str) -> int:
        """Append node `op(*args)` with one output of `shape`; returns the output tensor id."""
        out = self._tensor(shape, Role.ACTIVATION, name)
        nid = self._edit.new_id()
        self._edit.add_node(Node(nid, op, tuple(TensorRef(a) for a in args), {}, (out.id,), name=name,
                                 phase=Phase.FORWARD), [out])
        self._edit.insert_in_order(len(self.g.order), [nid])
        return out.id

    def output(self, t: int) -> None:
        self._edit.set_interface(outputs=[*self.g.outputs, t],
                                 output_names=[*self.g.output_names, f"out:{len(self.g.outputs)}"])


def insert_swap(g: Graph, tensor: int, store_after: int, load_before: int,
                users: list[int]) -> tuple[Graph, int, int]:
    """Swap `tensor` out after node `store_after`, back in before `load_before`; `users` read the copy.

    Returns (the new graph, store node id, load node id). The graph is checked.
    """
    meta = g.tensors[tensor]
    nbytes = g.storages[meta.storage]
    edit = GraphEditor(g)
    host_t, store_id, back_t, load_id = (edit.new_id() for _ in range(4))
    host_s, back_s = edit.add_storage(nbytes), edit.add_storage(nbytes)
    host = TensorMeta(host_t, meta.shape, meta.stride, meta.dtype, host_s, meta.storage_offset,
                      Role.ACTIVATION, f"{meta.name}.host")
    back = TensorMeta(back_t, meta.shape, meta.stride, meta.dtype, back_s, meta.storage_offset,
                      Role.ACTIVATION, f"{meta.name}.loaded")
    tags = NodeTags(SwapTag(tensor))      # as the swap rule tags its pair
    edit.add_node(Node(store_id, STORE_OP, (TensorRef(tensor),), {}, (host_t,),
                       name=f"store_{meta.name}", tags=tags), [host])
    edit.add_node(Node(load_id, LOAD_OP, (TensorRef(host_t),), {"device": torch.device(g.device)},
                       (back_t,), name=f"load_{meta.name}", tags=tags), [back])

    def reroute(ref: TensorRef) -> TensorRef:
        return TensorRef(back_t) if ref.id == tensor else ref

    for nid in users:
        n = g.nodes[nid]
        edit.replace_node(dataclasses.replace(n, args=map_refs(n.args, reroute),
                                              kwargs=map_refs(n.kwargs, reroute)))
    order = list(g.order)
    order.insert(order.index(store_after) + 1, store_id)
    order.insert(order.index(load_before), load_id)
    edit.set_order(order)
    new = edit.finish()
    check_graph(new)
    return new, store_id, load_id


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
    check_graph(b.g)
    return b.g, a, b.g.producer(a), b.g.producer(out)
