"""FX GraphModule (from make_fx) -> peakcut Graph.

Storage identity comes from the FakeTensors that flowed through the trace:
two values share a storage exactly when eager PyTorch would make them share
it (views, in-place results, _unsafe_view). Mutation hazards (a reader of a
buffer must run before the op that overwrites it, and after the op that last
wrote it) become explicit control edges, so any topological order of the
graph computes the same numbers (docs/design.md: in-place updates are real).

Output dtypes are the real kernels' (realcheck.py): where a fake kernel's dtype
is wrong, the tensor gets the real dtype, its storage the real byte size, and
the node tag fake_dtypes (FakeDtypesTag: what the fake kernel says, per output).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from peakcut.capture.constants import LIFTED
from peakcut.capture.fully_sharded import STORAGE_ALIASES
from peakcut.capture.real_layouts import output_mask
from peakcut.capture.realcheck import real_output_dtypes
from peakcut.capture.trace import CaptureError, TraceLog, kv_cache_hint
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph, StepSignature
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.tags import NO_TAGS, NodeTags, Tag, opt_str
from peakcut.ir.tensor import Role, TensorMeta, dtype_name


@dataclass(frozen=True, slots=True)
class FakeDtypesTag(Tag):
    """Per output of a node whose dtypes capture corrected to the real kernel's, the dtype the
    fake kernel gives (None: not corrected)."""

    kind: ClassVar[str] = "fake_dtypes"
    dtypes: tuple[str | None, ...]

    def to_json(self) -> list[str | None]:
        return list(self.dtypes)

    @classmethod
    def from_json(cls, doc: Any) -> FakeDtypesTag:
        return cls(tuple(opt_str(d) for d in doc))

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> FakeDtypesTag | None:
        return cls.from_json(extra["fake_dtypes"]) if "fake_dtypes" in extra else None



class _Builder:
    def __init__(self, aliases: Sequence[tuple[Any, Any]] = ()) -> None:
        self.metas: dict[int, TensorMeta] = {}
        self.storages: dict[int, int] = {}
        self._storage_ids: dict[StorageWeakRef, int] = {}
        # a fake storage that stands for another (a functional wait's result is its argument)
        self._aliases = {StorageWeakRef(alias): target for alias, target in aliases}
        self._keepalive: list[Any] = []
        self._next = 0

    def new_id(self) -> int:
        self._next += 1
        return self._next

    def tensor(self, val: torch.Tensor, role: Role, name: str, dtype: torch.dtype | None = None) -> int:
        """The meta of `val`; `dtype`: its real dtype where the fake one is wrong (a storage it
        creates then holds as many elements of the real dtype)."""
        dtype = val.dtype if dtype is None else dtype
        storage = val.untyped_storage()
        storage = self._aliases.get(StorageWeakRef(storage), storage)
        key = StorageWeakRef(storage)
        if key not in self._storage_ids:
            self._storage_ids[key] = self.new_id()
            self._keepalive.append(storage)  # keep the weak key's referent alive while converting
            nbytes = int(storage.nbytes())
            if dtype != val.dtype:
                nbytes = nbytes // val.element_size() * dtype.itemsize
            self.storages[self._storage_ids[key]] = nbytes
        tid = self.new_id()
        self.metas[tid] = TensorMeta(
            id=tid, shape=tuple(int(s) for s in val.shape), stride=tuple(int(s) for s in val.stride()),
            dtype=dtype_name(dtype), storage=self._storage_ids[key],
            storage_offset=int(val.storage_offset()), role=role, name=name,
        )
        return tid


def fx_to_graph(
    gm: torch.fx.GraphModule,
    input_names: Sequence[str],
    input_roles: Sequence[Role],
    output_names: Sequence[str],
    output_roles: Sequence[Role],
    keep_outputs: Sequence[bool],
    log: TraceLog,
    device: str,
    signature: StepSignature,
) -> Graph:
    """Convert a make_fx graph; output i is kept as a program output when keep_outputs[i].

    input_names / input_roles: the placeholders', then those of the constants the trace read
    (get_attr nodes marked by capture.constants), in order of first reading."""
    b = _Builder(gm.meta.get(STORAGE_ALIASES, ()))
    env: dict[torch.fx.Node, Any] = {}
    nodes: dict[int, Node] = {}
    order: list[int] = []
    inputs: list[int] = []
    constants: dict[str, int] = {}      # input name of a constant -> its tensor
    fwd_module_by_seq: dict[int, str] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    lifted = {n.meta[LIFTED] for n in gm.graph.nodes if n.op == "get_attr" and LIFTED in n.meta}
    if len(placeholders) + len(lifted) != len(input_names):
        raise CaptureError(f"internal: {len(placeholders)} placeholders and {len(lifted)} constants for "
                           f"{len(input_names)} inputs")
    roles = dict(zip(placeholders, input_roles[:len(placeholders)], strict=True))
    names = dict(zip(placeholders, input_names, strict=False))
    const_names = list(input_names[len(placeholders):])
    const_roles = dict(zip(const_names, input_roles[len(placeholders):], strict=True))
    real = real_output_dtypes(gm)
    log.notes.extend(real.notes)

    for index, fx_node in enumerate(gm.graph.nodes):
        if fx_node.op == "placeholder":
            tid = b.tensor(fx_node.meta["val"], roles[fx_node], names[fx_node])
            env[fx_node] = tid
            inputs.append(tid)
        elif fx_node.op == "get_attr" and LIFTED in fx_node.meta:     # a constant the step reads
            name = fx_node.meta[LIFTED]
            if name not in constants:
                constants[name] = b.tensor(getattr(gm, str(fx_node.target)), const_roles[name], name)
            env[fx_node] = constants[name]
        elif fx_node.op == "call_function" and fx_node.target is operator.getitem:
            parent, i = fx_node.args
            env[fx_node] = env[parent][i]
        elif fx_node.op == "call_function" and isinstance(fx_node.target, torch._ops.OpOverload):
            nid = b.new_id()
            module, phase = log.attribution(index)
            seq = fx_node.meta.get("seq_nr", -1)
            if phase is Phase.FORWARD and seq >= 0 and module:
                fwd_module_by_seq.setdefault(seq, module)
            elif phase is Phase.BACKWARD:
                module = fwd_module_by_seq.get(seq, "")
            val = fx_node.meta.get("val")
            multi = isinstance(val, (tuple, list))
            vals = list(val) if multi else [val]
            outs: list[int | None] = []
            real_dtypes = real.dtypes.get(fx_node)
            computed = output_mask(fx_node.target, fx_node.args, dict(fx_node.kwargs))
            for i, v in enumerate(vals):
                if isinstance(v, torch.Tensor) and computed is not None and i < len(computed) and not computed[i]:
                    outs.append(None)       # not asked for: the real kernel returns None (the fake a tensor)
                elif isinstance(v, torch.Tensor):
                    name = fx_node.name if not multi else f"{fx_node.name}_{i}"
                    outs.append(b.tensor(v, Role.ACTIVATION, name, real_dtypes[i] if real_dtypes else None))
                elif v is None:
                    outs.append(None)
                else:
                    raise CaptureError(f"op {fx_node.target} returns a non-tensor value {type(v).__name__}")
            env[fx_node] = outs if multi else outs[0]
            args = _map_args(fx_node.args, env)
            kwargs = {k: _map_args(v, env) for k, v in fx_node.kwargs.items()}
            tags = NodeTags(FakeDtypesTag(tuple(None if not isinstance(v, torch.Tensor) else dtype_name(v.dtype)
                                                for v in vals))) if real_dtypes else NO_TAGS
            run = log.run_at(index)
            if run is not None:
                tags = tags.with_tag(run) if tags else NodeTags(run)
            nodes[nid] = Node(
                id=nid, op=str(fx_node.target), args=tuple(args), kwargs=kwargs, outputs=tuple(outs),
                multi_output=multi, module=module, phase=phase, name=fx_node.name, tags=tags,
            )
            order.append(nid)
        elif fx_node.op == "output":
            flat = list(fx_node.args[0])
            if len(flat) != len(output_names):
                raise CaptureError(f"internal: {len(flat)} outputs for {len(output_names)} names")
        elif fx_node.op == "get_attr":
            nid = b.new_id()
            node, tid = _constant_node(b, nid, fx_node, getattr(gm, fx_node.target), device, log.attribution(index),
                                       log)
            env[fx_node] = tid
            nodes[nid] = node
            order.append(nid)
        else:
            raise CaptureError(f"unsupported FX node {fx_node.op} {fx_node.target}")

    outputs: list[int] = []
    out_names: list[str] = []
    for fx_out, name, role, keep in zip(flat, output_names, output_roles, keep_outputs, strict=True):
        tid = env[fx_out]
        if role is not Role.ACTIVATION:
            b.metas[tid] = _with_role(b.metas[tid], role)
        if keep:
            outputs.append(tid)
            out_names.append(name)

    g = Graph(
        tensors=b.metas, nodes=nodes, inputs=[*inputs, *(constants[n] for n in const_names)],
        input_names=list(input_names), outputs=outputs,
        output_names=out_names, storages=b.storages, order=order, control={}, device=device,
        signature=signature,
    )
    edit = GraphEditor(g)
    for nid, after in mutation_hazards(g).items():
        edit.set_control(nid, after)
    return edit.finish()


def _constant_node(b: _Builder, nid: int, fx_node: torch.fx.Node, value: Any, device: str,
                   where: tuple[str, Phase], log: TraceLog) -> tuple[Node, int]:
    """A 0-dim constant captured from the model (e.g. torch.tensor(-inf)) becomes aten.scalar_tensor."""
    if isinstance(value, torch.Generator):
        users = ", ".join(sorted({str(u.target) for u in fx_node.users})) or "a random op"
        raise CaptureError(f"{users} in module '{where[0]}' draws from a torch.Generator of its own "
                           "(generator=...): a captured step draws from the default generator only; drop the "
                           "generator argument and seed with torch.manual_seed outside the step")
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        shape = tuple(getattr(value, "shape", ()))
        message = (f"the step captured a constant tensor {fx_node.target} of shape {shape} in module "
                   f"'{where[0]}'")
        hint = kv_cache_hint(message, log) if log.kv_caches else ""
        raise CaptureError(message + (hint or "; only 0-dim constants are supported: register it as a "
                                      "buffer instead"))
    tid = b.tensor(value, Role.ACTIVATION, fx_node.name)
    node = Node(
        id=nid, op="aten.scalar_tensor.default", args=(value.item(),),
        kwargs={"dtype": value.dtype, "layout": torch.strided, "device": torch.device(device)},
        outputs=(tid,), module=where[0], phase=where[1], name=fx_node.name,
    )
    return node, tid


def _with_role(t: TensorMeta, role: Role) -> TensorMeta:
    if t.role.caller_held:
        return t  # a grad that is literally a caller-held tensor keeps its role
    return TensorMeta(t.id, t.shape, t.stride, t.dtype, t.storage, t.storage_offset, role, t.name)


def _map_args(value: Any, env: dict) -> Any:
    if isinstance(value, torch.fx.Node):
        tid = env[value]
        if isinstance(tid, list):
            raise CaptureError(f"op argument {value.name} is a tuple of tensors, not a tensor")
        return TensorRef(tid)
    if isinstance(value, (list, tuple)):
        mapped = [_map_args(v, env) for v in value]
        return mapped if isinstance(value, list) else tuple(mapped)  # FX's immutable_list is a list
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise CaptureError("symbolic shapes are not supported: capture with static shapes")
    return value


def mutation_hazards(g: Graph) -> dict[int, tuple[int, ...]]:
    """Control edges from capture order: read-after-write, write-after-read, write-after-write.

    Storage-level: any access to any view of a storage counts. Edges already
    implied by a data dependency are left out.
    """
    last_write: dict[int, int] = {}
    reads_since_write: dict[int, list[int]] = {}
    control: dict[int, set[int]] = {}
    for nid in g.order:
        node = g.nodes[nid]
        direct = {p for t in node.input_ids() if (p := g.producer(t)) is not None}
        written = {g.tensors[t].storage for t in g.mutated_tensors(nid)}
        for s in {g.tensors[t].storage for t in node.input_ids()}:
            w = last_write.get(s)
            if w is not None and w not in direct:
                control.setdefault(nid, set()).add(w)
            if s in written:
                for r in reads_since_write.get(s, []):
                    if r != nid and r not in direct:
                        control.setdefault(nid, set()).add(r)
                last_write[s] = nid
                reads_since_write[s] = []
            else:
                reads_since_write.setdefault(s, []).append(nid)
    return {k: tuple(sorted(v)) for k, v in control.items() if v}

