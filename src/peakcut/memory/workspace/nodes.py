"""Workspace of a graph's nodes under a workspace model, with explicit cache keys.

    order_workspace(g, order, "cpu")   # int64 bytes per position (zeros for workspace None)
    node_workspace(g, nid, "cpu")

A workspace spec is "cpu" (the CPU model for this process's machine: CpuMachine.current()),
a CpuWorkspace (the CPU model for a given, e.g. calibrated, machine) or None (no workspace).
Values are cached three times, all keyed by the machine they were computed for:
- per graph, by node id, in g.workspace_cache[machine] (Graph.copy copies it; node edits
  drop the node's entry): the simulators' hot path;
- per node object, with the metas of its tensors and the machine as the key (NODE_BYTES, a
  NodeCache): graphs derived from one another share unchanged node objects (part copies of
  a reused expansion, rewritten programs), and the metas are all a node's value reads from
  its graph;
- per call content (op, non-tensor arguments, shape/stride/dtype of every tensor argument
  and output, machine) in a bounded LRU cache shared by every graph: a node of a new graph
  that computes what an earlier one did (fission parts, rewritten programs) is not
  computed again.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.node_cache import NodeCache
from peakcut.ir.registry import resolve_op
from peakcut.ir.tensor import dtype_from_name
from peakcut.memory.workspace.machine import CpuMachine
from peakcut.memory.workspace.rules import cpu_workspace_bytes, workspace_ops

WORKSPACE_MODELS = ("cpu",)
CALL_CACHE_SIZE = 1 << 16
"""Distinct op calls whose workspace is kept (least recently used dropped first)."""


@dataclass(frozen=True)
class CpuWorkspace:
    """The CPU workspace model (peakcut.memory.workspace.rules) for one machine."""

    machine: CpuMachine

    @property
    def key(self) -> CpuMachine:
        """What its values depend on beyond the node: the key of its caches."""
        return self.machine


WorkspaceSpec = str | CpuWorkspace | None
"""A workspace model: "cpu" (this process's machine), a CpuWorkspace, or None (no workspace)."""


def workspace_model(spec: WorkspaceSpec) -> CpuWorkspace | None:
    """The model a spec names (None for None); raises ValueError for an unknown name."""
    if spec is None or isinstance(spec, CpuWorkspace):
        return spec
    if spec == "cpu":
        return CpuWorkspace(CpuMachine.current())
    raise ValueError(f"unknown workspace model {spec!r}; known: {WORKSPACE_MODELS}")


def node_workspace(g: Graph, nid: int, workspace: WorkspaceSpec = "cpu") -> int:
    """Bytes node `nid` allocates and frees while it runs, beyond its outputs."""
    model = workspace_model(workspace)
    if model is None or g.nodes[nid].op not in workspace_ops():
        return 0
    cache = g.workspace_cache.setdefault(model.key, {})
    value = cache.get(nid)
    if value is None:
        value = cache[nid] = _cached_node_bytes(g, g.nodes[nid], model.machine)
    return value


NODE_BYTES: NodeCache[int] = NodeCache()
"""Workspace bytes per node object, valid for (machine, metas of its inputs and outputs)."""


def _cached_node_bytes(g: Graph, node: Node, machine: CpuMachine) -> int:
    """_node_bytes through NODE_BYTES (module doc)."""
    tensors = g.tensors
    depends = (machine, tuple(map(tensors.__getitem__, node.input_tuple)),
               tuple(map(tensors.__getitem__, node.output_tuple)))
    value = NODE_BYTES.get(node, depends)
    if value is None:
        value = _node_bytes(g, node, machine)
        NODE_BYTES.put(node, value, depends)
    return value


def order_workspace(g: Graph, order: Sequence[int], workspace: WorkspaceSpec) -> npt.NDArray[np.int64]:
    """node_workspace of every node of `order`, as int64 (zeros for workspace None)."""
    ws = np.zeros(len(order), dtype=np.int64)
    if not len(order):
        return ws
    model = workspace_model(workspace)
    if model is None:
        return ws
    ops = workspace_ops()
    cache = g.workspace_cache.setdefault(model.key, {})
    nodes = g.nodes
    for i, nid in enumerate(order):
        node = nodes[nid]
        if node.op in ops:
            value = cache.get(nid)
            if value is None:
                value = cache[nid] = _cached_node_bytes(g, node, model.machine)
            ws[i] = value
    return ws


# ------------------------------------------------------------------ the per-call cache
@dataclass(frozen=True)
class _TensorKey:
    """What the rules can see of a tensor argument: its meta tensor's layout."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str

    def meta(self) -> torch.Tensor:
        return torch.empty_strided(self.shape, self.stride, dtype=dtype_from_name(self.dtype), device="meta")


def _key(value: Any, g: Graph) -> Hashable:
    """An argument as a hashable, type-tagged key (True, 1 and 1.0 stay apart), TensorRefs as
    the layout of the tensor they name."""
    if isinstance(value, TensorRef):
        m = g.tensors[value.id]
        return _TensorKey(m.shape, m.stride, m.dtype)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_key(v, g) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v, g)) for k, v in value.items()))
    return ("value", type(value), value)


def _value(key: Any) -> Any:
    """The argument a _key describes, with meta tensors for the tensors."""
    if isinstance(key, _TensorKey):
        return key.meta()
    kind = key[0]
    if kind == "list":
        return [_value(k) for k in key[1]]
    if kind == "tuple":
        return tuple(_value(k) for k in key[1])
    if kind == "dict":
        return {name: _value(k) for name, k in key[1]}
    return key[2]


def _node_bytes(g: Graph, node: Node, machine: CpuMachine) -> int:
    tensors = g.tensors
    outputs = tuple(_TensorKey(m.shape, m.stride, m.dtype) for m in map(tensors.__getitem__, node.output_tuple))
    args, kwargs = _key(node.args, g), _key(node.kwargs, g)
    try:
        hash((args, kwargs))
    except TypeError:   # an argument that cannot be hashed: computed, not cached
        return _call_bytes.__wrapped__(machine, node.op, args, kwargs, outputs)
    return _call_bytes(machine, node.op, args, kwargs, outputs)


@functools.lru_cache(maxsize=CALL_CACHE_SIZE)
def _call_bytes(machine: CpuMachine, op: str, args: Hashable, kwargs: Hashable,
                outputs: tuple[_TensorKey, ...]) -> int:
    """The workspace of one call, from its key (see _key)."""
    return cpu_workspace_bytes(resolve_op(op), _value(args), _value(kwargs), [o.meta() for o in outputs],
                               machine)
