"""The code of swaps (peakcut.store / peakcut.load nodes tagged as a swap) in the generated
step: store and load lines, and the waits before loaded tensors' first consumers.

Host copies are allocated through the step's `host` keyword, a codegen.swap.HostPool.

CUDA synchronisation, per swap, with events that are always recorded before they are waited
on:

    store (right after the producer of x):
        ev_x_ready.record(compute); d2h.wait_event(ev_x_ready)
        x_host = host.empty_strided(..., pinned=True)
        with torch.cuda.stream(d2h): x_host.copy_(x, non_blocking=True)
        x.record_stream(d2h)            # x's block is not reused while the copy reads it
        ev_x_host_stored.record(d2h)
    load:
        y = torch.empty_strided(..., device=device)     # on the compute stream
        h2d.wait_stream(compute)        # y's block may still be in use by earlier kernels
        h2d.wait_event(ev_x_host_stored)
        with torch.cuda.stream(h2d): y.copy_(x_host, non_blocking=True)
        y.record_stream(h2d)
        ev_y.record(h2d)
    right before the first consumer of y:
        compute.wait_event(ev_y)
        del x_host                      # only now; PyTorch's pinned allocator also records the
                                        # copy's stream, so the buffer is not reused early
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peakcut.codegen.hooks import CodeHook, LoopRefusal, Names, NodeCode
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.tags import SwapTag


def is_swap_store(node: Node) -> bool:
    """A swap's store (the stores of an update on the host carry NodeTags.host instead)."""
    return node.op == STORE_OP and node.tags.get(SwapTag) is not None


def has_swaps(g: Graph) -> bool:
    """True when g holds a swap (a store; its loads come with it)."""
    return any(is_swap_store(n) for n in g.nodes.values())


class SwapHook(CodeHook):
    """Swaps: their code (SwapCode), the step's `host` keyword and the copy streams' names; a
    fission region holding swap code, or reading a swapped-in tensor, is not a loop."""

    reserved_names = ("host", "compute", "d2h", "h2d")

    def loop_refusal(self, g: Graph) -> LoopRefusal | None:
        if not has_swaps(g):
            return None
        loads = {nid for nid, n in g.nodes.items() if n.op == LOAD_OP and not g.is_input_copy(n)}
        loaded = {t for nid in loads for t in g.nodes[nid].output_ids()}

        def refuse(nodes: Sequence[int]) -> str | None:
            for nid in nodes:
                node = g.nodes[nid]
                if is_swap_store(node) or nid in loads or loaded.intersection(node.input_ids()):
                    return "it holds swap code, which is emitted at the top level only"
            return None

        return refuse

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        return SwapCode(g, order, names) if has_swaps(g) else None


def _layout(g: Graph, tid: int) -> str:
    t = g.tensors[tid]
    return f"{tuple(t.shape)!r}, {tuple(t.stride)!r}"


class SwapCode(NodeCode):
    """Emits the lines of store and load nodes, and the waits before the loaded tensors' first
    consumers (CUDA), for one program (`order` on `g`, device type from g.device)."""

    def __init__(self, g: Graph, order: Sequence[int], names: Names) -> None:
        self.g = g
        self.names = names
        self.cuda = torch.device(g.device).type == "cuda"
        self._events: dict[int, str] = {}      # host/loaded tensor -> its event's name
        self._wait_before: dict[int, list[int]] = {}   # consumer node -> loads to wait for
        self._host_kept: set[int] = set()      # host tensors deleted after a wait, not at use
        self._del_after_wait: dict[int, list[int]] = {}  # load node -> host tensors to del
        if self.cuda:
            self._plan_waits(order)

    def _plan_waits(self, order: Sequence[int]) -> None:
        pos = {nid: i for i, nid in enumerate(order)}
        last_load: dict[int, int] = {}
        for nid in order:
            node = self.g.nodes[nid]
            if self._is_swap_load(node):
                (h,) = node.input_ids()
                last_load[h] = nid
        for nid in order:
            node = self.g.nodes[nid]
            if not self._is_swap_load(node):
                continue
            (y,) = node.output_ids()
            consumers = sorted(self.g.users(y), key=pos.__getitem__)
            # no consumer: wait right away (the load's own position) so the host copy can go
            at = consumers[0] if consumers else nid
            self._wait_before.setdefault(at, []).append(nid)
            (h,) = node.input_ids()
            self._host_kept.add(h)
            if last_load[h] == nid:
                self._del_after_wait.setdefault(nid, []).append(h)

    def _is_swap_load(self, node: Node) -> bool:
        """A load of a swapped-out copy (not of a program input kept in host memory)."""
        return node.op == LOAD_OP and not self.g.is_input_copy(node)

    # ---------------------------------------------------------------- program parts
    def signature_extra(self) -> str:
        return ", host"

    def prologue(self) -> list[str]:
        # (on CUDA the copy streams compute, d2h and h2d are made by codegen.source.copy_streams)
        return ["    # swapped-out copies live in `host` (a HostPool), apart from device memory"]

    def keeps(self, tensor: int) -> bool:
        """True when the source generator must not `del` this tensor at its last use (CUDA host
        copies: deleted after the consumer's wait instead)."""
        return tensor in self._host_kept

    def before(self, nid: int, pad: str) -> list[str]:
        """Waits for loads whose first consumer is `nid` (CUDA)."""
        return self._waits([load for load in self._wait_before.get(nid, []) if load != nid], pad)

    def _waits(self, loads: list[int], pad: str = "    ") -> list[str]:
        lines = []
        for load in loads:
            (y,) = self.g.nodes[load].output_ids()
            lines.append(f"{pad}compute.wait_event({self._events[y]})")
            dead = [self.names.by_tensor[h] for h in self._del_after_wait.get(load, [])]
            if dead:
                lines.append(f"{pad}del {', '.join(dead)}  # the pinned allocator keeps the block "
                             "until the copy is done")
        return lines

    def emit(self, node: Node) -> list[str] | None:
        """The lines of a store or of a load of its copy; None for any other node."""
        if is_swap_store(node):
            return self._store(node)
        if self._is_swap_load(node):
            return self._load(node)
        return None

    def _store(self, node: Node) -> list[str]:
        (x,) = node.input_ids()
        (h,) = node.output_ids()
        xn, hn = self.names.by_tensor[x], self.names.by_tensor[h]
        dtype = str(self.g.tensors[h].torch_dtype)
        if not self.cuda:
            return [
                f"    # swap out {xn} -> {hn} (host copy outside PyTorch's allocator)",
                f"    {hn} = host.empty_strided({_layout(self.g, h)}, {dtype})",
                f"    {hn}.copy_({xn})",
            ]
        computed = self.names.fresh(f"ev_{xn}_ready")
        stored = self.names.fresh(f"ev_{hn}_stored")
        self._events[h] = stored
        return [
            f"    # swap out {xn} -> {hn} on the d2h stream, after {xn} is computed",
            f"    {computed} = torch.cuda.Event()",
            f"    {computed}.record(compute)",
            f"    d2h.wait_event({computed})",
            f"    {hn} = host.empty_strided({_layout(self.g, h)}, {dtype}, pinned=True)",
            "    with torch.cuda.stream(d2h):",
            f"        {hn}.copy_({xn}, non_blocking=True)",
            f"    {xn}.record_stream(d2h)  # not reused by the allocator before the copy is done",
            f"    {stored} = torch.cuda.Event()",
            f"    {stored}.record(d2h)",
        ]

    def _load(self, node: Node) -> list[str]:
        (h,) = node.input_ids()
        (y,) = node.output_ids()
        hn, yn = self.names.by_tensor[h], self.names.by_tensor[y]
        dtype = str(self.g.tensors[y].torch_dtype)
        layout = _layout(self.g, y)
        alloc = f"    {yn} = torch.empty_strided({layout}, dtype={dtype}, device=device)"
        if not self.cuda:
            return [f"    # swap in {hn} -> {yn}", alloc, f"    {yn}.copy_({hn})"]
        loaded = self.names.fresh(f"ev_{yn}")
        self._events[y] = loaded
        lines = [
            f"    # swap in {hn} -> {yn} on the h2d stream, after its store",
            alloc,
            "    h2d.wait_stream(compute)  # the new block may still be in use by earlier kernels",
            f"    h2d.wait_event({self._events[h]})",
            "    with torch.cuda.stream(h2d):",
            f"        {yn}.copy_({hn}, non_blocking=True)",
            f"    {yn}.record_stream(h2d)",
            f"    {loaded} = torch.cuda.Event()",
            f"    {loaded}.record(h2d)",
        ]
        own = [node.id] if node.id in self._wait_before.get(node.id, []) else []
        return lines + self._waits(own)
