"""The Graph: tensors, nodes, caller-visible inputs/outputs, storages and order.

A Graph is the whole training step, read-only outside peakcut.ir: variants are made with
peakcut.ir.edit.GraphEditor. Copying is shallow (nodes and tensor metas are immutable), so
deriving a variant costs one dict copy per field. Queries (producers, users, in-place
writers, storage owners, host storages) are cached; the editor keeps or drops each cache
according to the edit.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from peakcut.ir.node import Node
from peakcut.ir.registry import is_opaque
from peakcut.ir.tensor import Role, TensorMeta

_CACHES = ("_producer", "_users", "_successors", "_writers", "_written", "_owner", "_host",
           "_ids", "_max_id")


class GraphError(ValueError):
    """The graph breaks one of the IR's rules (raised by ir.check.check_graph and the loaders)."""


@dataclass(frozen=True, slots=True)
class StepSignature:
    """How the program's flat inputs/outputs map to the caller's objects.

    input names: 'param:<name>', 'buffer:<name>', 'state:<param>.<slot>', 'acc:<param>',
    'scaler:scale', 'batch:<i>', 'const:<where>' (a tensor the step reads besides these:
    capture.constants). output names: 'loss', 'grad:<param>', 'found_inf', 'grad_norm' (the
    gradients' total norm before clipping), 'out:<i>'.
    """

    batch_spec: str = ""         # pytree treespec of the batch (torch.utils._pytree dumps)
    output_spec: str = ""        # pytree treespec of the model output (inference only)
    optimizer: dict[str, Any] = field(default_factory=dict)  # OptimizerSpec.to_dict(), {} if none
    mode: str = "train"          # "train" | "grad" | "inference"
    max_grad_norm: float | None = None   # gradients clipped by global norm before the update
    grad_scaler: bool = False    # loss scaled by 'scaler:scale'; unscaled, update skipped on inf/nan
    accumulate: bool = False     # 'acc:<param>' inputs (earlier micro-batches' p.grad) added to
    notes: tuple[str, ...] = ()  # what capture changed or found (use_cache off, real output dtypes)
    requires_grad: tuple[str, ...] = ()  # parameters that required a gradient at capture


_FIELDS = ("tensors", "nodes", "inputs", "input_names", "outputs", "output_names", "storages",
           "order", "control", "device", "signature")
"""What a graph is (compared by ==, pickled); everything else is a cache."""


class Graph:
    """A captured step, read-only: change one through peakcut.ir.edit.GraphEditor.

    tensors, nodes, storages and control are read-only mappings (MappingProxyType over the
    graph's own dicts), the lists and the other attributes cannot be assigned; only the
    editor (in this package) writes them, and keeps the caches below up to date as it does.

    tensors: tensor id -> meta. nodes: node id -> Node. inputs / outputs: the program's
    arguments and results (tensor ids, in order) and their names. storages: storage id ->
    bytes. order: node ids in capture (eager) order. control: node id -> nodes it must run
    after (mutation hazards). workspace_cache: workspace bytes by model key (the machine),
    then node id (peakcut.memory.workspace fills it; kept across copies; the editor drops a
    node's entries when it replaces or removes it).
    """

    __slots__ = (
        "tensors", "nodes", "storages", "control", "inputs", "input_names", "outputs",
        "output_names", "order", "device", "signature", "workspace_cache",
        "_tensors", "_nodes", "_storages", "_control",
        # caches, None until asked for (see GraphEditor for which edits keep which)
        "_producer", "_users", "_successors", "_writers", "_written", "_owner",
        "_host", "_ids", "_max_id",
    )
    tensors: Mapping[int, TensorMeta]
    nodes: Mapping[int, Node]
    storages: Mapping[int, int]
    control: Mapping[int, tuple[int, ...]]
    inputs: list[int]
    input_names: list[str]
    outputs: list[int]
    output_names: list[str]
    order: list[int]
    device: str
    signature: StepSignature
    workspace_cache: dict[Hashable, dict[int, int]]
    _tensors: dict[int, TensorMeta]
    _nodes: dict[int, Node]
    _storages: dict[int, int]
    _control: dict[int, tuple[int, ...]]
    _producer: dict[int, int] | None
    _users: dict[int, list[int]] | None
    _successors: dict[int, set[int]] | None
    _writers: dict[int, list[int]] | None
    _written: frozenset[int] | None          # tensors some node writes in place (with _writers)
    _owner: dict[int, int] | None
    _host: frozenset[int] | None
    _ids: frozenset[int] | None              # the node ids
    _max_id: int | None                       # the largest node, tensor or storage id

    def __init__(self, tensors: dict[int, TensorMeta], nodes: dict[int, Node], inputs: list[int],
                 input_names: list[str], outputs: list[int], output_names: list[str],
                 storages: dict[int, int], order: list[int], control: dict[int, tuple[int, ...]],
                 device: str = "cpu", signature: StepSignature | None = None,
                 workspace_cache: dict[Hashable, dict[int, int]] | None = None, *,
                 max_id: int | None = None) -> None:
        """The graph takes the given dicts and lists over (the caller must not change them).
        max_id: the largest id in them, when the caller knows it (next_id's cache)."""
        init = object.__setattr__
        init(self, "_tensors", tensors)
        init(self, "_nodes", nodes)
        init(self, "_storages", storages)
        init(self, "_control", control)
        init(self, "tensors", MappingProxyType(tensors))
        init(self, "nodes", MappingProxyType(nodes))
        init(self, "storages", MappingProxyType(storages))
        init(self, "control", MappingProxyType(control))
        init(self, "inputs", inputs)
        init(self, "input_names", input_names)
        init(self, "outputs", outputs)
        init(self, "output_names", output_names)
        init(self, "order", order)
        init(self, "device", device)
        init(self, "signature", StepSignature() if signature is None else signature)
        init(self, "workspace_cache", {} if workspace_cache is None else workspace_cache)
        for name in _CACHES:
            init(self, name, None)
        init(self, "_max_id", max_id)

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_"):
            raise AttributeError(f"Graph.{name} is read-only: edit a graph with "
                                 "peakcut.ir.edit.GraphEditor")
        object.__setattr__(self, name, value)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Graph({len(self._nodes)} nodes, {len(self._tensors)} tensors, "
                f"{len(self._storages)} storages, device={self.device!r})")

    def __getstate__(self) -> dict[str, Any]:
        # what the graph is; the caches are built again on the other side
        return {"tensors": self._tensors, "nodes": self._nodes, "inputs": self.inputs,
                "input_names": self.input_names, "outputs": self.outputs,
                "output_names": self.output_names, "storages": self._storages, "order": self.order,
                "control": self._control, "device": self.device, "signature": self.signature,
                "workspace_cache": self.workspace_cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        Graph.__init__(self, **state)

    # ---------------------------------------------------------------- copying
    def copy(self) -> Graph:
        """A variant with its own dicts and lists (no cached queries but the largest id)."""
        return Graph(
            tensors=dict(self._tensors), nodes=dict(self._nodes), inputs=list(self.inputs),
            input_names=list(self.input_names), outputs=list(self.outputs),
            output_names=list(self.output_names), storages=dict(self._storages),
            order=list(self.order), control=dict(self._control), device=self.device,
            signature=self.signature,
            workspace_cache={key: dict(values) for key, values in self.workspace_cache.items()},
            max_id=self._max_id,
        )

    def with_order(self, order: Iterable[int]) -> Graph:
        """A copy whose own (capture) order is `order` (the caller checks it is one)."""
        variant = self.copy()
        object.__setattr__(variant, "order", list(order))
        return variant

    # ---------------------------------------------------------------- queries
    def producer(self, tensor: int) -> int | None:
        """The node that outputs `tensor`, or None for program inputs."""
        if self._producer is None:
            self._producer = {t: n.id for n in self._nodes.values() for t in n.output_tuple}
        return self._producer.get(tensor)

    def producer_map(self) -> dict[int, int]:
        """Tensor id -> producing node for every node output (cached; do not modify)."""
        if self._producer is None:
            self._producer = {t: n.id for n in self._nodes.values() for t in n.output_tuple}
        return self._producer

    def users(self, tensor: int) -> list[int]:
        """Nodes that read `tensor`, in capture order."""
        if self._users is None:
            users: dict[int, list[int]] = {}
            nodes = self._nodes
            for nid in self.order:
                for t in nodes[nid].input_tuple:
                    found = users.get(t)
                    if found is None:
                        users[t] = [nid]
                    else:
                        found.append(nid)
            self._users = users
        return self._users.get(tensor, [])

    def users_of(self, tensors: Iterable[int]) -> dict[int, list[int]]:
        """{t: self.users(t)} for each of `tensors`; one pass over the order when users()
        is not cached (cheaper than building it for every tensor)."""
        wanted = set(tensors)
        if self._users is not None or not wanted:
            return {t: list(self.users(t)) for t in wanted}
        nodes = self._nodes
        order = self.order
        found: dict[int, list[int]] = {t: [] for t in wanted}
        disjoint = wanted.isdisjoint
        for nid in [nid for nid in order if not disjoint(nodes[nid].input_tuple)]:
            for t in nodes[nid].input_tuple:
                if t in wanted:
                    found[t].append(nid)
        return found

    def predecessors(self, node: int) -> set[int]:
        """Nodes that must run before `node`: producers of its inputs and control deps."""
        producer = self.producer_map()
        preds = {p for t in self._nodes[node].input_tuple if (p := producer.get(t)) is not None}
        preds.update(self._control.get(node, ()))
        preds.discard(node)
        return preds

    def successors(self, node: int) -> set[int]:
        """Nodes that must run after `node`: readers of its outputs and control dependants."""
        if self._successors is None:
            succ: dict[int, set[int]] = {}
            for nid in self._nodes:
                for p in self.predecessors(nid):
                    succ.setdefault(p, set()).add(nid)
            self._successors = succ
        return self._successors.get(node, set())

    def storage_writers(self, storage: int) -> list[int]:
        """Nodes that write `storage` in place, in graph order (cached until the graph changes)."""
        if self._writers is None:
            writers: dict[int, list[int]] = {}
            written: set[int] = set()
            nodes = self._nodes
            tensors = self._tensors
            for nid in self._writing_nodes():
                for t in nodes[nid].mutated_ids():
                    written.add(t)
                    found = writers.setdefault(tensors[t].storage, [])
                    if nid not in found:
                        found.append(nid)
            self._writers = writers
            self._written = frozenset(written)
        return self._writers.get(storage, [])

    def _writing_nodes(self) -> list[int]:
        """Nodes of self.order that write a tensor in place (or whose op is unknown), in order."""
        nodes = self._nodes
        # Node._mutated is what mutated_ids() returns, None when it raises (kept: it raises)
        return [nid for nid in self.order if (written := nodes[nid]._mutated) or written is None]

    def forget_workspace(self, node: int) -> None:
        """Drop the cached workspace of node id `node` (the editor replaced or removed it)."""
        for values in self.workspace_cache.values():
            values.pop(node, None)

    def mutated_tensors(self, node: int) -> list[int]:
        """Input tensors that `node` writes in place (from the op schema)."""
        return list(self._nodes[node].mutated_ids())

    def is_opaque(self, node: int) -> bool:
        """True when the registry does not know the op: it runs, untransformed."""
        return is_opaque(self._nodes[node].op)

    def tensors_with_role(self, role: Role) -> list[TensorMeta]:
        return [t for t in self._tensors.values() if t.role is role]

    def caller_held_storages(self) -> set[int]:
        """Storages of program inputs: held by the caller for the whole step."""
        return {self._tensors[t].storage for t in self.inputs}

    def host_storages(self) -> set[int]:
        """Storages in host memory: the outputs of swap-out (peakcut.store) nodes and of nodes
        that run on the host (NodeTags.on_host), the program inputs that live in host memory
        between steps (host_inputs), and, on an accelerator, the generator states
        peakcut.rng_state returns (host tensors, as torch.cuda.get_rng_state's are)."""
        from peakcut.ir.ops import LOAD_OP, RNG_STATE_OP, STORE_OP

        if self._host is None:
            tensors = self._tensors
            inputs = set(self.inputs)
            host: set[int] = set()
            for n in self._nodes.values():
                if n.op == STORE_OP:
                    host.update(tensors[t].storage for t in n.output_tuple)
                elif n.op == LOAD_OP:
                    host.update(tensors[t].storage for t in n.input_tuple if t in inputs)
                elif n.op == RNG_STATE_OP and not self.device.startswith("cpu"):
                    host.update(tensors[t].storage for t in n.output_tuple)
                elif n.tags.on_host:
                    host.update(tensors[t].storage for t in n.output_tuple)
                    host.update(tensors[t].storage for t in n.input_tuple if t in inputs)
            self._host = frozenset(host)
        return set(self._host)

    def is_input_copy(self, node: Node) -> bool:
        """A copy of a program input kept in host memory: a load of a program input, or a
        writeback (peakcut.ir.ops); the swap rule's stores and loads are not."""
        from peakcut.ir.ops import LOAD_OP, WRITEBACK_OP

        if node.op == WRITEBACK_OP:
            return True
        return node.op == LOAD_OP and self.producer(node.input_tuple[0]) is None   # an input

    def input_copies(self, role: Role) -> dict[int, Node]:
        """Node id -> node, for the loads and writebacks (is_input_copy) of the program inputs
        of `role` kept in host memory."""
        from peakcut.ir.ops import LOAD_OP, WRITEBACK_OP

        return {nid: n for nid, n in self._nodes.items() if n.op in (LOAD_OP, WRITEBACK_OP)
                and self.is_input_copy(n) and self._tensors[n.input_tuple[0]].role is role}

    def host_inputs(self) -> list[int]:
        """Program inputs that live in host memory between steps: the ones a load
        (peakcut.load) brings to the device or a node on the host reads. Only loads and host
        nodes read them, only writebacks (peakcut.writeback) and host nodes write them
        (ir.check); the caller keeps them in host memory."""
        host = self.host_storages()
        return [t for t in self.inputs if self._tensors[t].storage in host]

    def is_host_storage(self, storage: int) -> bool:
        """storage in host_storages(), without building the set (cached until the graph changes)."""
        host = self._host
        if host is None:
            self.host_storages()
            host = self._host
        return host is not None and storage in host

    def output_storages(self) -> set[int]:
        return {self._tensors[t].storage for t in self.outputs}

    def storage_owner(self) -> dict[int, int]:
        """Storage id -> node that allocates it (the first producer in capture order)."""
        return dict(self._owners())

    def storage_owner_of(self, storage: int) -> int | None:
        """storage_owner().get(storage), without copying the map."""
        return self._owners().get(storage)

    def _owners(self) -> dict[int, int]:
        # cached until an edit changes the nodes, the order or the inputs (the editor drops it)
        if self._owner is None:
            held = self.caller_held_storages()
            nodes = self._nodes
            tensors = self._tensors
            owner: dict[int, int] = {}
            for nid in self.order:
                for t in nodes[nid].output_tuple:
                    s = tensors[t].storage
                    if s not in held and s not in owner:
                        owner[s] = nid
            self._owner = owner
        return self._owner

    def param_bytes(self) -> int:
        return sum(self._storages[s] for s in {t.storage for t in self.tensors_with_role(Role.PARAM)})

    def node_ids(self) -> frozenset[int]:
        """The ids of the graph's nodes (cached until nodes come or go; a set built from the
        read-only `nodes` view costs several times more than from a dict)."""
        if self._ids is None:
            self._ids = frozenset(self._nodes)
        return self._ids

    def next_id(self) -> int:
        """A fresh id, unused by any node, tensor or storage (they share one numbering): the
        largest one used, plus one (cached until the graph changes)."""
        if self._max_id is None:
            self._max_id = max(max(self._nodes, default=0), max(self._tensors, default=0),
                               max(self._storages, default=0))
        return self._max_id + 1

    def summary(self) -> dict[str, Any]:
        return {
            "nodes": len(self._nodes),
            "tensors": len(self._tensors),
            "storages": len(self._storages),
            "param_bytes": self.param_bytes(),
            "opaque_nodes": sum(1 for n in self._nodes if self.is_opaque(n)),
        }
