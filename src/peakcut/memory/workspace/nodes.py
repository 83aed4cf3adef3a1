"""Workspace of a graph's nodes under a workspace model, with explicit cache keys.

    order_workspace(g, order, "cpu")   # int64 bytes per position (zeros for workspace None)
    node_workspace(g, nid, "cpu")

A workspace spec names a model:
- "cpu": this machine's CPU, calibrated: every distinct call measured once on this machine
  and cached on disk per fingerprint; the analytic rules where nothing can be measured
  (CalibratedCpuWorkspace, measured.py). The default.
- "cpu-rules": the analytic CPU rules alone, for this process's machine (CpuWorkspace of
  CpuMachine.current()); a CpuWorkspace for another (e.g. re-fitted) machine.
- "cuda": the GPU this process uses, measured: every distinct call run once on it
  (torch.cuda's allocator statistics) and cached per GPU fingerprint; 0 bytes where
  nothing can be measured (CalibratedCudaWorkspace, cuda.py).
- "auto" (every default): the model of the graph's device, "cuda" for a graph on a CUDA
  device present here, else "cpu".
- None: no workspace.
Values are cached three times, all keyed by the model's key:
- per graph, by node id, in g.workspace_cache[key] (Graph.copy copies it; node edits
  drop the node's entry): the simulators' hot path;
- per node object, with the metas of its tensors and the key (NODE_BYTES, a NodeCache):
  graphs derived from one another share unchanged node objects (part copies of a reused
  expansion, rewritten programs), and the metas are all a node's value reads from its graph;
- per call: the rules in a bounded LRU cache shared by every graph (a node of a new graph
  that computes what an earlier one did is not computed again), the calibrated model in its
  table of measured calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
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
from peakcut.memory.workspace.cuda import CalibratedCudaWorkspace
from peakcut.memory.workspace.machine import CpuMachine
from peakcut.memory.workspace.measured import CalibratedCpuWorkspace
from peakcut.memory.workspace.rules import cpu_workspace_bytes, workspace_ops

WORKSPACE_MODELS = ("auto", "cpu", "cpu-rules", "cuda")
CALL_CACHE_SIZE = 1 << 16
"""Distinct op calls whose workspace is kept (least recently used dropped first)."""


@dataclass(frozen=True)
class CpuWorkspace:
    """The analytic CPU workspace rules (peakcut.memory.workspace.rules) for one machine."""

    machine: CpuMachine
    spec = "cpu-rules"

    @property
    def key(self) -> CpuMachine:
        """What its values depend on beyond the node: the key of its caches."""
        return self.machine

    def can_measure(self) -> bool:
        """The rules are always there: their answers are always kept."""
        return True

    def describe(self) -> str:
        """Which model this is, for reports."""
        fit = "" if self.machine == CpuMachine.current() else " (another machine's settings)"
        return f"cpu workspace rules (analytic, fitted to one AVX-512 CPU){fit}"

    def applies(self, op: str) -> bool:
        """Whether nodes of `op` can have workspace (others take 0 without a lookup)."""
        return op in workspace_ops()

    def nodes_bytes(self, g: Graph, nodes: Sequence[Node],
                    rules: Callable[[Node], int] | None = None) -> list[int]:
        """Workspace of each node by the rules."""
        return [_node_bytes(g, n, self.machine) for n in nodes]


WorkspaceModel = CpuWorkspace | CalibratedCpuWorkspace | CalibratedCudaWorkspace
WorkspaceSpec = str | WorkspaceModel | None
"""A workspace model: "auto" (the model of the graph's device, the default), "cpu" (calibrated
on this machine), "cpu-rules", "cuda" (measured on this process's current GPU), a model, or None."""


def workspace_model(spec: WorkspaceSpec, device: str | torch.device = "cpu") -> WorkspaceModel | None:
    """The model a spec names (None for None); "auto" is the model of `device`, the graph's:
    the GPU's own (measured on it) for a CUDA device present here, else this CPU's calibrated
    one (a graph captured on the meta device, or a CUDA graph simulated on a machine without
    that GPU). Raises ValueError for an unknown name."""
    if spec is None or isinstance(spec, (CpuWorkspace, CalibratedCpuWorkspace, CalibratedCudaWorkspace)):
        return spec
    if spec == "auto":
        dev = torch.device(device)
        on_gpu = dev.type == "cuda" and torch.cuda.is_available() and (dev.index or 0) < torch.cuda.device_count()
        return CalibratedCudaWorkspace.for_device(dev) if on_gpu else CalibratedCpuWorkspace.for_this_machine()
    if spec == "cpu":
        return CalibratedCpuWorkspace.for_this_machine()
    if spec == "cpu-rules":
        return CpuWorkspace(CpuMachine.current())
    if spec == "cuda":
        return CalibratedCudaWorkspace.for_device()
    raise ValueError(f"unknown workspace model {spec!r}; known: {WORKSPACE_MODELS}")


def model_name(model: WorkspaceModel | None) -> str:
    """The spec that names `model`'s kind: "cpu", "cpu-rules", "cuda" ("no" for None)."""
    return "no" if model is None else model.spec


def describe_workspace(spec: WorkspaceSpec, device: str | torch.device = "cpu") -> str:
    """One line saying which workspace model `spec` is (for a graph on `device`), for reports."""
    model = workspace_model(spec, device)
    return "no workspace model" if model is None else model.describe()


def node_workspace(g: Graph, nid: int, workspace: WorkspaceSpec = "auto") -> int:
    """Device bytes node `nid` allocates and frees while it runs, beyond its outputs (0 for a
    node on the host: its scratch is host memory)."""
    return int(order_workspace(g, [nid], workspace)[0])


NODE_BYTES: NodeCache[int] = NodeCache()
"""Workspace bytes per node object, valid for (model key, metas of its inputs and outputs)."""


def order_workspace(g: Graph, order: Sequence[int], workspace: WorkspaceSpec) -> npt.NDArray[np.int64]:
    """node_workspace of every node of `order`, as int64 (zeros for workspace None)."""
    ws = np.zeros(len(order), dtype=np.int64)
    if not len(order):
        return ws
    model = workspace_model(workspace, g.device)
    if model is None:
        return ws
    cache = g.workspace_cache.setdefault(model.key, {})
    nodes = g.nodes
    applies = model.applies
    missing: dict[int, list[int]] = {}
    for i, nid in enumerate(order):
        value = cache.get(nid)
        if value is None:
            node = nodes[nid]
            if applies(node.op) and not node.tags.on_host:   # host ops: no device scratch
                missing.setdefault(nid, []).append(i)
            else:
                cache[nid] = 0
        elif value:
            ws[i] = value
    if missing:
        _fill(g, model, cache, missing, ws)
    return ws


def _fill(g: Graph, model: WorkspaceModel, cache: dict[int, int], missing: dict[int, list[int]],
          ws: npt.NDArray[np.int64]) -> None:
    """Compute the nodes of `missing` (node id -> positions in ws): NODE_BYTES first, then
    the model, all new nodes at once (a calibrated model measures them in one batch)."""
    tensors = g.tensors
    new: list[tuple[Node, Any]] = []
    for nid in missing:
        node = g.nodes[nid]
        depends = (model.key, tuple(map(tensors.__getitem__, node.input_tuple)),
                   tuple(map(tensors.__getitem__, node.output_tuple)))
        value = NODE_BYTES.get(node, depends)
        if value is None:
            new.append((node, depends))
        else:
            cache[nid] = value
    if new:
        machine = model.machine
        keep = model.can_measure()         # answers given instead of a measurement are not kept
        # where nothing is measured: the CPU rules of the model's CPU; a GPU model has none (0)
        values = model.nodes_bytes(g, [n for n, _ in new],
                                   (lambda n: 0) if machine is None else (lambda n: _node_bytes(g, n, machine)))
        for (node, depends), value in zip(new, values, strict=True):
            if keep:
                NODE_BYTES.put(node, value, depends)
                cache[node.id] = value
            for i in missing[node.id]:
                ws[i] = value
    for nid, positions in missing.items():
        if nid in cache:
            ws[positions] = cache[nid]


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
