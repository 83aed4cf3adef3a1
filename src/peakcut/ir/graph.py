"""The Graph: tensors, nodes, caller-visible inputs/outputs, storages and order.

A Graph is the whole training step. Copying is shallow (nodes and tensor
metas are immutable), so deriving a variant costs one dict copy per field.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from peakcut.ir.node import Node
from peakcut.ir.registry import is_opaque
from peakcut.ir.tensor import Role, TensorMeta


class GraphError(ValueError):
    """The graph breaks one of the IR's rules (raised by Graph.check and loaders)."""


@dataclass(frozen=True, slots=True)
class StepSignature:
    """How the program's flat inputs/outputs map to the caller's objects.

    input names: 'param:<name>', 'buffer:<name>', 'state:<param>.<slot>', 'acc:<param>',
    'scaler:scale', 'batch:<i>'. output names: 'loss', 'grad:<param>', 'found_inf', 'out:<i>'.
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


@dataclass
class Graph:
    """A captured step. Build with peakcut.capture; mutate only through methods."""

    tensors: dict[int, TensorMeta]
    nodes: dict[int, Node]
    inputs: list[int]                       # program arguments, in order
    input_names: list[str]
    outputs: list[int]                      # program results, in order
    output_names: list[str]
    storages: dict[int, int]                # storage id -> bytes
    order: list[int]                        # node ids in capture (eager) order
    control: dict[int, tuple[int, ...]]     # node id -> nodes it must run after (mutation hazards)
    device: str = "cpu"
    signature: StepSignature = field(default_factory=StepSignature)
    # workspace bytes by model key (the machine), then node id; peakcut.memory.workspace fills it
    workspace_cache: dict[Hashable, dict[int, int]] = field(default_factory=dict, repr=False, compare=False)
    _producer: dict[int, int] | None = field(default=None, repr=False, compare=False)
    _users: dict[int, list[int]] | None = field(default=None, repr=False, compare=False)
    _successors: dict[int, set[int]] | None = field(default=None, repr=False, compare=False)
    _writers: dict[int, list[int]] | None = field(default=None, repr=False, compare=False)
    _owner: dict[int, int] | None = field(default=None, repr=False, compare=False)
    _owner_order: list[int] | None = field(default=None, repr=False, compare=False)
    _host: frozenset[int] | None = field(default=None, repr=False, compare=False)

    # ---------------------------------------------------------------- copying
    def copy(self) -> Graph:
        """A variant that can be mutated without touching this graph."""
        return Graph(
            tensors=dict(self.tensors), nodes=dict(self.nodes), inputs=list(self.inputs),
            input_names=list(self.input_names), outputs=list(self.outputs),
            output_names=list(self.output_names), storages=dict(self.storages),
            order=list(self.order), control=dict(self.control), device=self.device,
            signature=self.signature,
            workspace_cache={key: dict(values) for key, values in self.workspace_cache.items()},
        )

    def _invalidate(self) -> None:
        self._producer = None
        self._users = None
        self._successors = None
        self._writers = None
        self._owner = None
        self._owner_order = None
        self._host = None

    # ---------------------------------------------------------------- queries
    def producer(self, tensor: int) -> int | None:
        """The node that outputs `tensor`, or None for program inputs."""
        if self._producer is None:
            self._producer = {t: n.id for n in self.nodes.values() for t in n.output_tuple}
        return self._producer.get(tensor)

    def producer_map(self) -> dict[int, int]:
        """Tensor id -> producing node for every node output (cached; do not modify)."""
        if self._producer is None:
            self._producer = {t: n.id for n in self.nodes.values() for t in n.output_tuple}
        return self._producer

    def users(self, tensor: int) -> list[int]:
        """Nodes that read `tensor`, in capture order."""
        if self._users is None:
            users: dict[int, list[int]] = {}
            nodes = self.nodes
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
        nodes = self.nodes
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
        preds = {p for t in self.nodes[node].input_tuple if (p := producer.get(t)) is not None}
        preds.update(self.control.get(node, ()))
        preds.discard(node)
        return preds

    def successors(self, node: int) -> set[int]:
        """Nodes that must run after `node`: readers of its outputs and control dependants."""
        if self._successors is None:
            succ: dict[int, set[int]] = {}
            for nid in self.nodes:
                for p in self.predecessors(nid):
                    succ.setdefault(p, set()).add(nid)
            self._successors = succ
        return self._successors.get(node, set())

    def storage_writers(self, storage: int) -> list[int]:
        """Nodes that write `storage` in place, in graph order (cached until the graph changes)."""
        if self._writers is None:
            writers: dict[int, list[int]] = {}
            nodes = self.nodes
            tensors = self.tensors
            for nid in self._writing_nodes():
                for t in nodes[nid].mutated_ids():
                    found = writers.setdefault(tensors[t].storage, [])
                    if nid not in found:
                        found.append(nid)
            self._writers = writers
        return self._writers.get(storage, [])

    def _writing_nodes(self) -> list[int]:
        """Nodes of self.order that write a tensor in place (or whose op is unknown), in order."""
        nodes = self.nodes
        # Node._mutated is what mutated_ids() returns, None when it raises (kept: it raises)
        return [nid for nid in self.order if (written := nodes[nid]._mutated) or written is None]

    def adopt_caches(self, other: Graph, added: Iterable[Node]) -> None:
        """Take over `other`'s cached producers, in-place writers and host storages, with the
        nodes `added` (added last, in this order) included, instead of rebuilding them.

        For a graph made from `other` by adding `added`, rewiring readers (their outputs
        unchanged) and re-homing views that no node writes in place and no swap-out makes,
        with the nodes of `other` in the same relative order and no node removed: what swap
        and remat do (their preconditions guarantee the rest). Call it after the last edit;
        any later edit drops the caches again.
        """
        from peakcut.ir.ops import STORE_OP

        added = list(added)
        if other._producer is not None:
            producer = dict(other._producer)
            for n in added:
                for t in n.output_tuple:
                    producer[t] = n.id
            self._producer = producer
        if not any(n.mutated_ids() for n in added):
            self._writers = other._writers   # shared, read-only
        if other._host is not None:
            tensors = self.tensors
            self._host = other._host | {tensors[t].storage for n in added if n.op == STORE_OP
                                        for t in n.output_tuple}

    def mutated_tensors(self, node: int) -> list[int]:
        """Input tensors that `node` writes in place (from the op schema)."""
        return list(self.nodes[node].mutated_ids())

    def is_opaque(self, node: int) -> bool:
        """True when the registry does not know the op: it runs, untransformed."""
        return is_opaque(self.nodes[node].op)

    def tensors_with_role(self, role: Role) -> list[TensorMeta]:
        return [t for t in self.tensors.values() if t.role is role]

    def caller_held_storages(self) -> set[int]:
        """Storages of program inputs: held by the caller for the whole step."""
        return {self.tensors[t].storage for t in self.inputs}

    def host_storages(self) -> set[int]:
        """Storages in host memory: the outputs of swap-out (peakcut.store) nodes."""
        from peakcut.ir.ops import STORE_OP

        if self._host is None:
            tensors = self.tensors
            self._host = frozenset({tensors[t].storage for n in self.nodes.values() if n.op == STORE_OP
                                    for t in n.output_tuple})
        return set(self._host)

    def is_host_storage(self, storage: int) -> bool:
        """storage in host_storages(), without building the set (cached until the graph changes)."""
        if self._host is None:
            self.host_storages()
        host = self._host
        return host is not None and storage in host

    def output_storages(self) -> set[int]:
        return {self.tensors[t].storage for t in self.outputs}

    def storage_owner(self) -> dict[int, int]:
        """Storage id -> node that allocates it (the first producer in capture order)."""
        return dict(self._owners())

    def storage_owner_of(self, storage: int) -> int | None:
        """storage_owner().get(storage), without copying the map."""
        return self._owners().get(storage)

    def _owners(self) -> dict[int, int]:
        # cached until the graph changes or self.order is assigned another list
        if self._owner is None or self._owner_order is not self.order:
            held = self.caller_held_storages()
            nodes = self.nodes
            tensors = self.tensors
            owner: dict[int, int] = {}
            for nid in self.order:
                for t in nodes[nid].output_tuple:
                    s = tensors[t].storage
                    if s not in held and s not in owner:
                        owner[s] = nid
            self._owner = owner
            self._owner_order = self.order
        return self._owner

    def param_bytes(self) -> int:
        return sum(self.storages[s] for s in {t.storage for t in self.tensors_with_role(Role.PARAM)})

    # ---------------------------------------------------------------- mutation
    def add_node(self, node: Node, tensors: Iterable[TensorMeta] = ()) -> None:
        """Add a node and its new output tensors (order is not changed)."""
        if node.id in self.nodes:
            raise GraphError(f"node id {node.id} already exists")
        for t in tensors:
            self.tensors[t.id] = t
        self.nodes[node.id] = node
        self.forget_workspace(node.id)
        self._invalidate()

    def remove_node(self, node: int) -> None:
        """Remove a node that nobody uses any more (its outputs go too)."""
        n = self.nodes[node]
        for t in n.output_ids():
            if self.users(t) or t in self.outputs:
                raise GraphError(f"cannot remove {n.name or n.op}: output {t} is still used")
        for t in n.output_ids():
            del self.tensors[t]
        del self.nodes[node]
        self.forget_workspace(node)
        self.order = [x for x in self.order if x != node]
        self.control.pop(node, None)
        self._invalidate()

    def replace_node(self, node: Node) -> None:
        """Put `node` in place of the node with the same id (its outputs must stay the same)."""
        if node.id not in self.nodes:
            raise GraphError(f"cannot replace node {node.id}: no such node")
        self.nodes[node.id] = node
        self.forget_workspace(node.id)
        self._invalidate()

    def forget_workspace(self, node: int) -> None:
        """Drop the cached workspace of node id `node` (its node was replaced or removed)."""
        for values in self.workspace_cache.values():
            values.pop(node, None)

    def set_tensor(self, meta: TensorMeta) -> None:
        """Add or replace a tensor's metadata (e.g. a view that moves to another storage)."""
        self.tensors[meta.id] = meta
        self._invalidate()

    def add_control(self, node: int, after: int) -> None:
        """Make `node` run after `after` (an ordering edge with no data)."""
        if node not in self.nodes or after not in self.nodes:
            raise GraphError(f"add_control: unknown node {node if node not in self.nodes else after}")
        found = self.control.get(node, ())
        if after not in found:
            self.control[node] = (*found, after)
            self.changed()

    def changed(self) -> None:
        """Tell the graph that nodes, tensors or control edges were edited directly.

        Cached producers, users, successors, in-place writers, storage owners and host
        storages are dropped and rebuilt when next asked for (storage owners also when
        `order` is assigned another list); cached workspaces are kept (they depend on a
        node's op and shapes only; replace_node drops the replaced node's).
        """
        self._invalidate()

    def next_id(self) -> int:
        """A fresh id, unused by any node, tensor or storage (they share one numbering)."""
        return max(max(self.nodes, default=0), max(self.tensors, default=0), max(self.storages, default=0)) + 1

    # ---------------------------------------------------------------- checks and (de)serialization
    def check(self) -> None:
        """Validate the graph; raises GraphError naming the first problem found."""
        from peakcut.ir.check import check_graph

        check_graph(self)

    def to_json(self) -> str:
        from peakcut.ir.serialize import graph_to_json

        return graph_to_json(self)

    @staticmethod
    def from_json(text: str) -> Graph:
        from peakcut.ir.serialize import graph_from_json

        return graph_from_json(text)

    def summary(self) -> dict[str, Any]:
        return {
            "nodes": len(self.nodes),
            "tensors": len(self.tensors),
            "storages": len(self.storages),
            "param_bytes": self.param_bytes(),
            "opaque_nodes": sum(1 for n in self.nodes if self.is_opaque(n)),
        }
