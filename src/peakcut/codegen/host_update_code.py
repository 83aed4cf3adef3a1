"""The code of updates on the host (the nodes tagged NodeTags.host) in the generated step.

The step takes `host` (a codegen.swap.HostPool: the host buffers) and `host_ops` (a
codegen.host_worker.HostWorker: the host stream). Per node of the rule:

    store (a device tensor x the update reads -> host copy x_host):
        CPU:  x_host = host.empty_strided(...); x_host.copy_(x)
        CUDA: as a swap's store (codegen/swap_code.py): on the d2h stream after x is computed,
              recording ev_x_host_stored
    an op of the update (on host tensors; results are Futures the next host ops resolve):
        (CUDA: the first op that writes a host-kept tensor since copies on h2d read it waits
         for an event recorded on h2d, ev_h2d_loads_issued, as its host memory may still be
         being read by them)
        m1 = host_ops.run(aten.lerp_.Scalar, s_w_exp_avg, g_host, hp['g0:one_minus_beta1'],
                          after=(ev_g_host_stored,))        # CUDA: the first reader waits for the copy
        d = host_ops.run(aten.sqrt.out, v1, out=host_ops.buffer(...))   # a host buffer, made when it runs
    upload (the new value of a parameter that lives on the device):
        CPU:  host_ops.upload(p_w, p_w_host)
        CUDA: ev = torch.cuda.Event(); ev.record(compute)   # the readers of the old value are issued
              host_ops.upload(p_w, p_w_host, h2d, ev)       # h2d waits for them, then copies
    end of the step:
        host_ops.join()          # every update on the host is done (its errors raised here)
        h2d.synchronize()        # CUDA, with uploads: the parameters hold their new values

On CUDA the HostWorker runs the ops on a worker thread, in this order, while the Python thread
goes on issuing kernels; on CPU it runs each op as it is submitted.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peakcut.codegen.calls import argument_sources, op_target
from peakcut.codegen.hooks import CodeHook, LoopRefusal, Names, NodeCode
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node
from peakcut.ir.ops import LOAD_OP
from peakcut.ir.registry import out_variant
from peakcut.ir.tags import HostTag


class HostUpdateHook(CodeHook):
    """Updates on the host: their code (HostUpdateCode) and the step's `host_ops` keyword; a
    fission region holding one is not a loop."""

    reserved_names = ("host_ops",)

    def loop_refusal(self, g: Graph) -> LoopRefusal | None:
        mine = {nid for nid, n in g.nodes.items() if n.tags.get(HostTag) is not None}
        if not mine:
            return None

        def refuse(nodes: Sequence[int]) -> str | None:
            if mine.intersection(nodes):
                return "it holds an update on the host, which is emitted at the top level only"
            return None

        return refuse

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        if not any(n.tags.get(HostTag) is not None for n in g.nodes.values()):
            return None
        return HostUpdateCode(g, order, names)


def _layout(g: Graph, tid: int) -> str:
    meta = g.tensors[tid]
    return f"{tuple(meta.shape)!r}, {tuple(meta.stride)!r}, {meta.torch_dtype}"


class HostUpdateCode(NodeCode):
    """The lines of the host updates' stores, ops and uploads in one program (module doc)."""

    def __init__(self, g: Graph, order: Sequence[int], names: Names) -> None:
        self.g = g
        self.names = names
        self.cuda = torch.device(g.device).type == "cuda"
        self.mine = {nid: n for nid, n in g.nodes.items() if n.tags.get(HostTag) is not None}
        self._stored: dict[int, str] = {}       # host copy -> the event its store records (CUDA)
        self._waits: dict[int, list[int]] = {}  # host op -> host copies it waits for (CUDA)
        self._fences: set[int] = set()          # host ops that wait for the h2d loads before them (CUDA)
        if self.cuda:
            waited: set[int] = set()
            loaded: set[int] = set()     # host storages an h2d load read, not fenced since
            for nid in order:
                node = g.nodes[nid]
                if node.op == LOAD_OP:
                    loaded.update(g.tensors[t].storage for t in node.input_tuple)
                if node.tags.on_host:
                    fresh = [t for t in node.input_tuple if self._is_store_output(t) and t not in waited]
                    waited.update(fresh)
                    if fresh:
                        self._waits[nid] = fresh
                    written = {g.tensors[t].storage for t in node.mutated_ids()} & loaded
                    if written:         # its host tensor may still be read by a copy on h2d
                        self._fences.add(nid)
                        loaded -= written
        self.params = sorted({tag.param for n in self.mine.values() if (tag := n.tags.get(HostTag)) is not None})

    def _is_store_output(self, t: int) -> bool:
        producer = self.g.producer(t)
        node = self.mine.get(producer) if producer is not None else None
        return node is not None and (tag := node.tags.get(HostTag)) is not None and tag.role == "store"

    def signature_extra(self) -> str:
        return ", host, host_ops"

    def prologue(self) -> list[str]:
        where = "a worker thread, beside the device" if self.cuda else "the host, as they come"
        return [f"    # the optimizer update of {len(self.params)} parameter(s) runs on {where}: "
                "`host_ops` (a HostWorker) runs those ops in order"]

    def emit(self, node: Node) -> list[str] | None:
        tag = node.tags.get(HostTag)
        if node.id not in self.mine or tag is None:
            return None
        role = tag.role
        if role == "store":
            return self._store(node)
        if role == "upload":
            return self._upload(node)
        return self._op(node)

    def _store(self, node: Node) -> list[str]:
        (x,) = node.input_ids()
        (h,) = node.output_ids()
        xn, hn = self.names.by_tensor[x], self.names.by_tensor[h]
        if not self.cuda:
            return [f"    # {xn} to host memory for its update on the host",
                    f"    {hn} = host.empty_strided({_layout(self.g, h)})",
                    f"    {hn}.copy_({xn})"]
        computed = self.names.fresh(f"ev_{xn}_ready")
        stored = self._stored[h] = self.names.fresh(f"ev_{hn}_stored")
        return [f"    # {xn} to host memory for its update on the host, on the d2h stream",
                f"    {computed} = torch.cuda.Event()",
                f"    {computed}.record(compute)",
                f"    d2h.wait_event({computed})",
                f"    {hn} = host.empty_strided({_layout(self.g, h)}, pinned=True)",
                "    with torch.cuda.stream(d2h):",
                f"        {hn}.copy_({xn}, non_blocking=True)",
                f"    {xn}.record_stream(d2h)  # not reused by the allocator before the copy is done",
                f"    {stored} = torch.cuda.Event()",
                f"    {stored}.record(d2h)"]

    def _op(self, node: Node) -> list[str]:
        names = self.names.by_tensor
        args = argument_sources(node, names, self.g.device)
        target = op_target(node.op)
        (out,) = node.output_ids() or (None,)
        if out is not None and node.allocates():
            variant = out_variant(node.op)
            if variant is None:     # refused when the update was moved to the host
                raise ValueError(f"{node.op} has no out= overload to run on the host")
            target = op_target(variant)
            args.append(f"out=host_ops.buffer({_layout(self.g, out)})")
        waits = [self._stored[h] for h in self._waits.get(node.id, [])]
        fence: list[str] = []
        if node.id in self._fences:
            loads_done = self.names.fresh("ev_h2d_loads_issued")
            waits.append(loads_done)
            fence = ["    # it writes a host tensor that copies on the h2d stream read: after them",
                     f"    {loads_done} = torch.cuda.Event()",
                     f"    {loads_done}.record(h2d)"]
        if waits:
            args.append(f"after=({', '.join(waits)},)")
        call = f"host_ops.run({', '.join([target, *args])})"
        return [*fence, f"    {names[out]} = {call}" if out is not None else f"    {call}"]

    def _upload(self, node: Node) -> list[str]:
        device, source = node.input_ids()
        dn, sn = self.names.by_tensor[device], self.names.by_tensor[source]
        if not self.cuda:
            return [f"    host_ops.upload({dn}, {sn})  # the new value of {dn}, back where it lives"]
        issued = self.names.fresh(f"ev_{dn}_read")
        return [f"    # the new value of {dn} back to the device on the h2d stream, once its readers ran",
                f"    {issued} = torch.cuda.Event()",
                f"    {issued}.record(compute)",
                f"    host_ops.upload({dn}, {sn}, h2d, {issued})"]

    def epilogue(self) -> list[str]:
        lines = ["    host_ops.join()  # the updates on the host are done"]
        if self.cuda and any((tag := n.tags.get(HostTag)) is not None and tag.role == "upload" for n in self.mine.values()):
            lines.append("    h2d.synchronize()  # the parameters hold their new values when the step returns")
        return lines
