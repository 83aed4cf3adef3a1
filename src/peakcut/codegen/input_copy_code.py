"""The code of the copies of program inputs kept in host memory between steps: loads (host to
device) and writebacks (device to host) of optimizer state and parameters kept there.

On CPU the copies are plain copies. On CUDA they run on the copy streams, as swaps do
(codegen/swap_code.py, whose streams they share when the program also swaps), with events
recorded before they are waited on:

    load (host input x -> device copy y):
        y = torch.empty_strided(..., device=device)       # on the compute stream
        h2d.wait_stream(compute)     # y's block may still be in use by earlier kernels
        with torch.cuda.stream(h2d): y.copy_(x, non_blocking=True)
        y.record_stream(h2d)
        ev_y = torch.cuda.Event(); ev_y.record(h2d)
    right before the first consumer of y:
        compute.wait_event(ev_y)
    writeback (device copy y -> host input x, after the update's last write):
        ev = torch.cuda.Event(); ev.record(compute); d2h.wait_event(ev)
        with torch.cuda.stream(d2h): x.copy_(y, non_blocking=True)
        y.record_stream(d2h)
    end of the step:
        d2h.synchronize()            # the host tensors hold the new values when the step returns

The host tensor is not written during the step before its writeback (the rules order the
writeback after every load), and the step ends with the writebacks done, so the next step's
loads read the new values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from peakcut.codegen.hooks import CodeHook, LoopRefusal, Names, NodeCode
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase
from peakcut.ir.ops import LOAD_OP, WRITEBACK_OP
from peakcut.ir.tensor import Role

ROLES = (Role.OPT_STATE, Role.PARAM)
"""The roles of host-kept inputs, each with its own hook, in the order their code comes."""

_SEGMENT = {Phase.FORWARD: "forward", Phase.LOSS: "forward", Phase.BACKWARD: "backward",
            Phase.OPTIMIZER: "update"}
"""The use a parameter's load serves, by the phase of the node it feeds (the loss reads the
forward's copy)."""


class InputCopyHook(CodeHook):
    """The loads and writebacks of host-kept inputs of one role; regions holding them are not
    loops."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.what = "optimizer state" if role is Role.OPT_STATE else "parameter"

    def loop_refusal(self, g: Graph) -> LoopRefusal | None:
        mine = set(g.input_copies(self.role))
        if not mine:
            return None
        what = "optimizer-state" if self.role is Role.OPT_STATE else "parameter"

        def refuse(nodes: Sequence[int]) -> str | None:
            if mine.intersection(nodes):
                return f"it holds {what} copies, which are emitted at the top level only"
            return None

        return refuse

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        if not g.input_copies(self.role):
            return None
        return InputCopyCode(g, order, names, self.role, self.what, self._purpose)

    def _purpose(self, load: Node) -> str:
        return "its update" if self.role is Role.OPT_STATE else f"its {_SEGMENT[load.phase]} use"


def _layout(g: Graph, tid: int) -> str:
    meta = g.tensors[tid]
    return f"{tuple(meta.shape)!r}, {tuple(meta.stride)!r}"


class InputCopyCode(NodeCode):
    """The lines of one role's loads and writebacks (`mine`) in one program.

    role: whose copies; what: the inputs' kind in comments ("parameter");
    purpose(load node): what the load is for."""

    def __init__(self, g: Graph, order: Sequence[int], names: Names, role: Role, what: str,
                 purpose: Callable[[Node], str]) -> None:
        self.g = g
        self.names = names
        self.mine = g.input_copies(role)
        self.what = what
        self.purpose = purpose
        self.cuda = torch.device(g.device).type == "cuda"
        self._events: dict[int, str] = {}          # load node -> the event its copy records
        self._wait_before: dict[int, list[int]] = {}   # consumer node -> loads to wait for
        if self.cuda:
            pos = {nid: i for i, nid in enumerate(order)}
            for nid, node in self.mine.items():
                if node.op == LOAD_OP:
                    (y,) = node.output_ids()
                    consumers = sorted(g.users(y), key=pos.__getitem__)
                    self._wait_before.setdefault(consumers[0] if consumers else nid, []).append(nid)
        # the end-of-step wait is written once, by the first of: this code for optimizer
        # state, this code for parameters (the streams: codegen.source.copy_streams)
        earlier = ROLES[:ROLES.index(role)]
        self._first = not any(g.input_copies(r) for r in earlier)

    def before(self, nid: int, pad: str) -> list[str]:
        return [f"{pad}compute.wait_event({self._events[load]})" for load in self._wait_before.get(nid, [])
                if load != nid]

    def emit(self, node: Node) -> list[str] | None:
        if node.id not in self.mine:
            return None
        name = self.names.by_tensor
        if node.op == WRITEBACK_OP:
            host, source = node.input_ids()
            if not self.cuda:
                return [f"    {name[host]}.copy_({name[source]})  # the updated {self.what} back to host memory"]
            done = self.names.fresh(f"ev_{name[source]}_written")
            return [f"    # the updated {self.what} back to host memory, on the d2h stream",
                    f"    {done} = torch.cuda.Event()",
                    f"    {done}.record(compute)",
                    f"    d2h.wait_event({done})",
                    "    with torch.cuda.stream(d2h):",
                    f"        {name[host]}.copy_({name[source]}, non_blocking=True)",
                    f"    {name[source]}.record_stream(d2h)"]
        (host,) = node.input_ids()
        (dev,) = node.output_ids()
        meta = self.g.tensors[dev]
        comment = f"    # {self.what} {name[host]} lives in host memory: copy it in for {self.purpose(node)}"
        alloc = f"    {name[dev]} = torch.empty_strided({_layout(self.g, dev)}, dtype={meta.torch_dtype}, device=device)"
        if not self.cuda:
            return [comment, alloc, f"    {name[dev]}.copy_({name[host]})"]
        loaded = self._events[node.id] = self.names.fresh(f"ev_{name[dev]}")
        lines = [comment + ", on the h2d stream", alloc,
                 "    h2d.wait_stream(compute)  # the new block may still be in use by earlier kernels",
                 "    with torch.cuda.stream(h2d):",
                 f"        {name[dev]}.copy_({name[host]}, non_blocking=True)",
                 f"    {name[dev]}.record_stream(h2d)",
                 f"    {loaded} = torch.cuda.Event()",
                 f"    {loaded}.record(h2d)"]
        if node.id in self._wait_before.get(node.id, []):
            lines.append(f"    compute.wait_event({loaded})")
        return lines

    def epilogue(self) -> list[str]:
        if self.cuda and self._first and any(n.op == WRITEBACK_OP and self.g.is_input_copy(n)
                                             for n in self.g.nodes.values()):
            return ["    d2h.synchronize()  # the host-kept inputs hold their new values when the step returns"]
        return []
