"""Graph validation: references, acyclicity, order, roles, storages and shapes."""

from __future__ import annotations

import rustworkx as rx
import torch

from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.node import TensorRef, map_refs
from peakcut.ir.ops import LOAD_OP, RNG_STATE_OPS, STORE_OP, UPLOAD_OP, WRITEBACK_OP
from peakcut.ir.real_dtypes import with_real_dtypes
from peakcut.ir.tensor import Role, TensorMeta


def check_graph(g: Graph, infer_shapes: bool = True) -> None:
    """Raise GraphError naming the first broken rule; return None when the graph is sound."""
    _check_references(g)
    _check_roles_and_storages(g)
    _check_order(g)
    _check_host_copies(g)
    if infer_shapes:
        _check_shapes(g)


def _describe(g: Graph, nid: int) -> str:
    n = g.nodes[nid]
    where = f" in {n.module}" if n.module else ""
    return f"node {n.name or nid} ({n.op}){where}"


def _check_references(g: Graph) -> None:
    produced: dict[int, int] = {}
    for nid, n in g.nodes.items():
        if nid != n.id:
            raise GraphError(f"node stored under id {nid} says its id is {n.id}")
        for t in n.input_ids():
            if t not in g.tensors:
                raise GraphError(f"{_describe(g, nid)} reads unknown tensor {t}")
        for t in n.output_ids():
            if t not in g.tensors:
                raise GraphError(f"{_describe(g, nid)} outputs unknown tensor {t}")
            if t in produced:
                raise GraphError(f"tensor {t} is produced twice ({produced[t]} and {nid})")
            produced[t] = nid
    for t in g.inputs:
        if t not in g.tensors:
            raise GraphError(f"program input {t} is not a tensor of the graph")
        if t in produced:
            raise GraphError(f"program input {t} is also produced by node {produced[t]}")
    for t in g.outputs:
        if t not in g.tensors:
            raise GraphError(f"program output {t} is not a tensor of the graph")
    if len(g.inputs) != len(g.input_names) or len(g.outputs) != len(g.output_names):
        raise GraphError("inputs/outputs and their names differ in length")
    reachable = set(g.inputs) | set(produced)
    orphans = [t for t in g.tensors if t not in reachable]
    if orphans:
        raise GraphError(f"tensors {orphans[:5]} are neither program inputs nor produced by a node")


def _check_roles_and_storages(g: Graph) -> None:
    inputs = set(g.inputs)
    for t in g.tensors.values():
        if t.storage not in g.storages:
            raise GraphError(f"tensor {t.id} ({t.name}) lives in unknown storage {t.storage}")
        if len(t.shape) != len(t.stride) or any(s < 0 for s in t.shape):
            raise GraphError(f"tensor {t.id} ({t.name}) has a bad shape/stride {t.shape}/{t.stride}")
        if t.role.caller_held != (t.id in inputs):
            kind = "a program input" if t.id in inputs else "computed by the step"
            raise GraphError(f"tensor {t.id} ({t.name}) has role {t.role.value} but is {kind}")
        if t.numel:
            extent = t.storage_offset + 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride, strict=True))
            if extent * t.itemsize > g.storages[t.storage]:
                raise GraphError(
                    f"tensor {t.id} ({t.name}) reaches past the end of its storage "
                    f"({extent * t.itemsize} > {g.storages[t.storage]} bytes)"
                )
    param_storages = {g.tensors[t].storage for t in g.inputs if g.tensors[t].role is Role.PARAM}
    for nid in g.nodes:
        for tid in g.mutated_tensors(nid):
            s = g.tensors[tid].storage
            if s in param_storages and g.nodes[nid].phase.value not in ("optimizer",):
                raise GraphError(f"{_describe(g, nid)} writes a parameter outside the optimizer update")


def _check_host_copies(g: Graph) -> None:
    """Host memory is reached only through its copies and the nodes on the host: loads read
    host memory; stores read device memory; a writeback copies a device tensor into a program
    input kept in host memory (Graph.host_inputs); an upload copies a host tensor into device
    memory; a node on the host (NodeTags.on_host) reads and writes host memory only; a
    generator's state is read and set from host memory (peakcut.rng_state / set_rng_state);
    any other node touches no host memory."""
    host = g.host_storages()
    host_inputs = set(g.host_inputs())

    def in_host(t: int | None) -> bool:
        return t is not None and g.tensors[t].storage in host

    for nid in g.order:
        n = g.nodes[nid]
        if n.op == LOAD_OP:
            if not all(in_host(t) for t in n.input_ids()):
                raise GraphError(f"{_describe(g, nid)} loads a tensor that is not in host memory")
            continue
        if n.op == STORE_OP:
            if any(in_host(t) for t in n.input_ids()):
                raise GraphError(f"{_describe(g, nid)} stores a tensor that is in host memory already")
            continue
        if n.op in (WRITEBACK_OP, UPLOAD_OP):
            target, source = (a.id if isinstance(a, TensorRef) else None for a in n.args[:2])
            if n.op == WRITEBACK_OP and (target not in host_inputs or source is None or in_host(source)):
                raise GraphError(f"{_describe(g, nid)} must copy a device tensor into a program "
                                 "input kept in host memory")
            if n.op == UPLOAD_OP and (target is None or in_host(target) or not in_host(source)):
                raise GraphError(f"{_describe(g, nid)} must copy a host tensor into device memory")
            continue
        if n.op in RNG_STATE_OPS:       # a generator's state: a host tensor on an accelerator
            continue
        if n.tags.on_host:
            device = [t for t in (*n.input_ids(), *n.output_ids()) if not in_host(t)]
            if device:
                raise GraphError(f"{_describe(g, nid)} runs on the host but touches "
                                 f"{g.tensors[device[0]].name or device[0]}, which is in device memory")
            continue
        read = host_inputs.intersection(n.input_ids())
        if read:
            raise GraphError(f"{_describe(g, nid)} reads program input {min(read)}, which lives in "
                             "host memory: only loads and nodes on the host read it")
        touched = [t for t in (*n.input_ids(), *n.output_ids()) if in_host(t)]
        if touched:
            raise GraphError(f"{_describe(g, nid)} runs on the device but touches "
                             f"{g.tensors[touched[0]].name or touched[0]}, which is in host memory")


def _check_order(g: Graph) -> None:
    if sorted(g.order) != sorted(g.nodes):
        raise GraphError("order is not a permutation of the graph's nodes")
    dag = rx.PyDiGraph(check_cycle=False, multigraph=False)
    index = {nid: dag.add_node(nid) for nid in g.nodes}
    for nid in g.nodes:
        for p in g.predecessors(nid):
            if p not in index:
                raise GraphError(f"{_describe(g, nid)} depends on unknown node {p}")
            dag.add_edge(index[p], index[nid], None)
    if not rx.is_directed_acyclic_graph(dag):
        cycle = rx.digraph_find_cycle(dag)
        raise GraphError(f"graph has a cycle through nodes {[dag[a] for a, _ in cycle][:6]}")
    pos = {nid: i for i, nid in enumerate(g.order)}
    for nid in g.nodes:
        for p in g.predecessors(nid):
            if pos[p] > pos[nid]:
                raise GraphError(f"order runs {_describe(g, nid)} before {_describe(g, p)} it depends on")


def _check_shapes(g: Graph) -> None:
    """Re-run every known op on FakeTensors of the graph's device; compare output shapes and dtypes.

    FakeTensors (not meta tensors) because some output dtypes are device-specific
    (e.g. layer-norm statistics of bf16 input are bf16 on CPU, fp32 on meta/CUDA).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=False):
        for nid in g.order:
            if not g.is_opaque(nid):
                _check_node_shapes(g, nid)


def _fake(meta: TensorMeta, device: str) -> torch.Tensor:
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.torch_dtype, device=device)


def _check_node_shapes(g: Graph, nid: int) -> None:
    n = g.nodes[nid]
    fakes = {t: _fake(g.tensors[t], g.device) for t in n.input_ids()}
    args = map_refs(n.args, lambda ref: fakes[ref.id])
    kwargs = map_refs(n.kwargs, lambda ref: fakes[ref.id])
    try:
        result = with_real_dtypes(n.op, args, n.overload()(*args, **kwargs), torch.device(g.device).type)
    except NotImplementedError:
        return  # no fake/meta kernel: the shape cannot be re-derived here
    except RuntimeError as e:
        raise GraphError(f"{_describe(g, nid)} fails on its input shapes: {e}") from None
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) != len(n.outputs):
        raise GraphError(f"{_describe(g, nid)} returns {len(results)} values, graph says {len(n.outputs)}")
    for out_id, r in zip(n.outputs, results, strict=True):
        if out_id is None or not isinstance(r, torch.Tensor):
            continue
        t = g.tensors[out_id]
        if tuple(r.shape) != t.shape or r.dtype != t.torch_dtype:
            raise GraphError(
                f"{_describe(g, nid)}: output {t.name or out_id} is {tuple(r.shape)}/{r.dtype}, "
                f"graph says {t.shape}/{t.dtype}"
            )
