"""The one graph editor: every change to a graph after it is built goes through a GraphEditor.

    ed = GraphEditor(g)                 # edits a copy of g; g itself never changes
    mm = ed.add_op("aten.mm.default", (TensorRef(a), TensorRef(b)), {}, name="mm_x",
                   phase=Phase.FORWARD, module="")
    ed.rewire(reader, {old: mm.outputs[0]})
    ed.insert_in_order(position, [mm.id])
    new = ed.finish()

Ids: nodes, tensors and storages share one numbering; new_id() hands out fresh ones from the
source's next_id() (or a given start) upwards. add_op makes a node from an op call with its
output metas from a FakeTensor run that keeps the real storage identity (peakcut.ir.infer):
a view or in-place result lives in its input's storage, anything else in a fresh storage of
the bytes the run allocates. add_node adds a node whose metas the caller made.

Caches: the copy starts with the source's cached queries (shared: a cache is never changed in
place by anyone but the editor, which copies before it extends one) and every edit keeps the
caches it leaves true and drops the others, which the graph rebuilds when next asked:

    edit                     producers   users,      in-place   storage   host
                                         successors  writers    owners    storages
    add_node / add_op        extended    dropped     kept (1)   dropped   extended (2)
    replace_node (3)         kept        dropped     kept (4)   kept      kept (5)
    remove_node(s)           shrunk      dropped     kept (1)   dropped   kept (5)
    set_tensor               kept        kept        kept (6)   kept (6)  kept (6)
    set_control              kept        successors  kept       kept      kept
    insert_in_order          kept        users (8)   kept (1)   dropped   kept
    set_order                kept        users (8)   dropped    dropped   kept
    storages, interface      kept        kept        kept       dropped (7) dropped (7)

(1) unless a node added, removed or placed writes in place; (2) by the storages of a store's
outputs; dropped by a load of anything else (a program input kept in host memory) and by a
node that runs on the host (NodeTags.on_host); (3) the new node must have the old one's
outputs; (4) when both write the same tensors; (5) unless a store, a load or a node on the
host comes or goes; (6) a tensor moved to another storage drops the
writers when it is written in place, the owners, and the host storages when it left one;
(7) owners and host storages only when the inputs change; (8) users are listed in order,
successors do not depend on it. A node's cached workspace is dropped whenever the
node is added, replaced or removed; the set of node ids whenever a node comes or goes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from peakcut.ir.graph import _CACHES, Graph, GraphError, StepSignature
from peakcut.ir.infer import FakeStorages, Layout, LayoutMemo
from peakcut.ir.node import Node, Phase, TensorRef, map_refs
from peakcut.ir.ops import LOAD_OP, STORE_OP, is_swap_op
from peakcut.ir.tags import NO_TAGS, NodeTags
from peakcut.ir.tensor import Role, TensorMeta

LayoutCheck = Callable[[list[Layout | None]], None]
"""add_op's hook: sees the inferred layouts before anything is added, raises to refuse."""


def rewired(node: Node, mapping: Mapping[int, int]) -> Node:
    """The same node reading mapping[t] in place of every tensor t in `mapping`."""

    def swap_ref(ref: TensorRef) -> TensorRef:
        return TensorRef(mapping.get(ref.id, ref.id))

    return Node(id=node.id, op=node.op, args=map_refs(node.args, swap_ref),
                kwargs=map_refs(node.kwargs, swap_ref), outputs=node.outputs,
                multi_output=node.multi_output, module=node.module, phase=node.phase,
                name=node.name, tags=node.tags)


def splice(order: Sequence[int], position: int, nodes: Sequence[int]) -> list[int]:
    """`order` with `nodes` inserted at index `position` (0 = first), in their order."""
    out = list(order)
    out[position:position] = nodes
    return out


def _drop(g: Graph, *caches: str) -> None:
    """Forget these cached queries of g (the graph builds them again when asked)."""
    for name in caches:
        if getattr(g, name) is not None:   # most are None already: skip the write
            object.__setattr__(g, name, None)


def _writes(node: Node) -> bool:
    """The node writes a tensor in place (or its op is unknown, so it may)."""
    written = node._mutated
    return written is None or bool(written)


class GraphEditor:
    """Edits a private copy of a graph (module doc); `graph` is the graph being edited."""

    def __init__(self, source: Graph, *, next_id: int | None = None,
                 memo: LayoutMemo | None = None) -> None:
        """next_id: the first id to hand out (default source.next_id()); memo: the layout
        memo add_op uses (peakcut.ir.infer; default: one of this editor's own)."""
        start = source.next_id()      # cached on the source first: the copy takes the cache
        g = source.copy()
        for name in _CACHES:           # shared: see the module docstring
            setattr(g, name, getattr(source, name))
        self.graph = g
        self._next = start if next_id is None else next_id
        self._memo = memo
        self._fakes: FakeStorages | None = None
        self._own_producer: dict[int, int] | None = None
        self._holes = False        # something was deleted from the graph's dicts (see finish)
        self._finished = False

    # ------------------------------------------------------------ ids
    def new_id(self) -> int:
        """A fresh id for a node, tensor or storage."""
        value = self._next
        self._next += 1
        return value

    @property
    def next_id(self) -> int:
        """The id new_id() hands out next."""
        return self._next

    # ------------------------------------------------------------ storages
    def add_storage(self, nbytes: int) -> int:
        """A new storage of `nbytes` bytes; its id."""
        storage = self.new_id()
        self._live()._storages[storage] = nbytes
        self._used(storage)
        return storage

    def resize_storage(self, storage: int, nbytes: int) -> None:
        """Give an existing storage another size (it keeps its place among the storages)."""
        g = self._live()
        if storage not in g._storages:
            raise GraphError(f"resize_storage: unknown storage {storage}")
        g._storages[storage] = nbytes
        self._forget_fake(storage)

    def remove_storages(self, storages: Iterable[int]) -> None:
        """Remove storages no tensor lives in any more."""
        g = self._live()
        for s in storages:
            if g._storages.pop(s, None) is not None:
                self._gone(s)
            self._forget_fake(s)

    def remove_unused_storages(self, candidates: Iterable[int] | None = None) -> None:
        """Remove the storages among `candidates` (default: all) no tensor lives in."""
        g = self._live()
        used = {m.storage for m in g._tensors.values()}
        pool = list(g._storages) if candidates is None else list(candidates)
        self.remove_storages(s for s in pool if s not in used and s in g._storages)

    def _forget_fake(self, storage: int) -> None:
        if self._fakes is not None:
            self._fakes.forget(storage)

    # ------------------------------------------------------------ nodes and tensors
    def add_node(self, node: Node, tensors: Iterable[TensorMeta] = ()) -> None:
        """Add `node` and its new output tensors (the order is not changed)."""
        if self._finished:
            self._live()
        g = self.graph
        nid = node.id
        if nid in g._nodes:
            raise GraphError(f"node id {nid} already exists")
        top = nid
        metas = g._tensors
        for meta in tensors:
            metas[meta.id] = meta
            if meta.id > top:
                top = meta.id
        g._nodes[nid] = node
        # what follows runs for every node of a fission expansion: kept lean
        if g._ids is not None:
            object.__setattr__(g, "_ids", None)
        if g._max_id is not None and top > g._max_id:
            object.__setattr__(g, "_max_id", top)
        if g.workspace_cache:
            g.forget_workspace(nid)
        producer = g._producer
        if producer is not None:
            if producer is not self._own_producer:
                producer = self._producer_to_change()
            for t in node.output_tuple:
                producer[t] = nid
        written = node._mutated
        if written is None or written:
            self._drop_writers()
        if node.tags.on_host:
            _drop(g, "_host")        # its outputs, and the inputs it touches, are in host memory
        elif node.op == STORE_OP and g._host is not None:
            g._host = g._host | {metas[t].storage for t in node.output_tuple}
        elif node.op == LOAD_OP and g._host is not None and not g._host.issuperset(
                metas[t].storage for t in node.input_tuple):
            _drop(g, "_host")        # it brings in a program input that lives in host memory
        if g._users is not None or g._successors is not None or g._owner is not None:
            _drop(g, "_users", "_successors", "_owner")

    def add_op(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, name: str,
               phase: Phase, module: str, tags: NodeTags = NO_TAGS, multi_output: bool = False,
               names: Sequence[str] | None = None, outputs: Sequence[int | None] | None = None,
               check: LayoutCheck | None = None, tensor_ids_first: bool = False) -> Node:
        """A new node calling `op`, its outputs' metas from a FakeTensor run (module doc).

        names: the output tensors' names (default `name`, `name_<j>` for several outputs).
        outputs: per output, an existing tensor id the node outputs instead of a new tensor (a
        preallocation standing for a tensor, or a rewrite keeping a result's id), or None for
        a new tensor: an existing one must come out of the run in a fresh storage of its own
        (no other output in it) with the tensor's shape, stride and dtype, and the tensor's
        storage takes that storage's size.
        check: sees the layouts before anything is added and may raise.
        Ids: the node's first, then per output its new storage and its tensor (the tensor
        first with tensor_ids_first, as the TASO rules number them). Raises
        peakcut.ir.infer.InferenceError when the op fails on its inputs, GraphError when an
        output cannot stand for the given tensor.
        """
        if self._finished:
            self._live()
        g = self.graph
        fakes = self._fakes if self._fakes is not None else self.fakes
        layouts = fakes.layouts(g, op, args, kwargs)
        if check is not None:
            check(layouts)
        nid = self.new_id()
        out_ids: list[int | None] = []
        metas: list[TensorMeta] = []
        fresh: dict[int, int] = {}     # fresh storage of the run -> its storage id
        made: list[int] = []           # the new storages among them
        runs = Counter(lay[4][1] for lay in layouts if lay is not None and lay[4][0] == "fresh")
        for j, layout in enumerate(layouts):
            if layout is None:
                out_ids.append(None)
                continue
            shape, stride, dtype, offset, source = layout
            keep = outputs[j] if outputs is not None else None
            tid = self.new_id() if tensor_ids_first and keep is None else None
            if keep is not None:
                existing = g._tensors[keep]
                if source[0] != "fresh" or runs[source[1]] != 1 or (shape, stride, dtype) != (
                        existing.shape, existing.stride, existing.dtype):
                    raise GraphError(f"{op} cannot stand for tensor {existing.id}: it gives "
                                     f"{shape}/{stride}/{dtype} in its {source[0]} storage")
                self.resize_storage(existing.storage, source[2])
                out_ids.append(existing.id)
                continue
            if source[0] == "in":
                storage = source[1]
            else:
                storage = fresh.get(source[1], -1)
                if storage < 0:
                    storage = fresh[source[1]] = self.new_id()
                    g._storages[storage] = source[2]
                    made.append(storage)
            if tid is None:
                tid = self.new_id()
            label = names[j] if names is not None else (name if len(layouts) == 1 else f"{name}_{j}")
            metas.append(TensorMeta(tid, shape, stride, dtype, storage, offset, Role.ACTIVATION, label))
            out_ids.append(tid)
        if made:
            self._used(max(made))
        node = Node(id=nid, op=op, args=args, kwargs=kwargs, outputs=tuple(out_ids),
                    multi_output=multi_output, module=module, phase=phase, name=name, tags=tags)
        self.add_node(node, metas)
        return node

    @property
    def fakes(self) -> FakeStorages:
        """The fake storages of the graph being edited (peakcut.ir.infer), kept in step with its
        storages: what add_op runs calls on; run other calls of this graph on them too."""
        if self._fakes is None:
            self._fakes = FakeStorages(self._memo)
        return self._fakes

    def replace_node(self, node: Node) -> None:
        """Put `node` in place of the node with its id; it must have the same outputs."""
        g = self._live()
        old = g._nodes.get(node.id)
        if old is None:
            raise GraphError(f"cannot replace node {node.id}: no such node")
        if old.outputs != node.outputs:
            raise GraphError(f"cannot replace node {node.id}: its outputs would change")
        g._nodes[node.id] = node
        if g.workspace_cache:
            g.forget_workspace(node.id)
        if old._mutated != node._mutated or old._mutated is None:
            self._drop_writers()
        if is_swap_op(old.op) or is_swap_op(node.op) or old.tags.on_host or node.tags.on_host:
            _drop(g, "_host")
        _drop(g, "_users", "_successors")

    def rewire(self, nid: int, mapping: Mapping[int, int]) -> bool:
        """Node `nid` reads mapping[t] in place of every tensor t it reads that is in `mapping`;
        False (and nothing done) when it reads none of them."""
        node = self._live()._nodes[nid]
        if not any(t in mapping for t in node.input_tuple):
            return False
        self.replace_node(rewired(node, mapping))
        return True

    def remove_node(self, nid: int) -> None:
        """Remove a node nobody reads any more (its outputs go too), from the order and from
        its own control edges (those of others naming it are the caller's to fix)."""
        g = self._live()
        node = g._nodes[nid]
        for t in node.output_tuple:
            if g.users(t) or t in g.outputs:
                raise GraphError(f"cannot remove {node.name or node.op}: output {t} is still used")
        self.remove_nodes([nid])

    def remove_nodes(self, nids: Iterable[int], keep_tensors: Iterable[int] = ()) -> None:
        """Remove nodes (no check that their outputs are unused) and their output tensors
        except `keep_tensors` (tensors another node outputs now); from the order too."""
        g = self._live()
        gone = list(nids)
        keep = set(keep_tensors)
        producer = self._producer_to_change() if g._producer is not None else None
        top = -1        # the largest id deleted
        for nid in gone:
            node = g._nodes.pop(nid)
            top = nid if nid > top else top
            for t in node.output_tuple:
                if t not in keep:
                    del g._tensors[t]
                    top = t if t > top else top
                if producer is not None and producer.get(t) == nid:
                    del producer[t]
            g._control.pop(nid, None)
            if g.workspace_cache:
                g.forget_workspace(nid)
            if _writes(node):
                self._drop_writers()
            if is_swap_op(node.op) or node.tags.on_host:   # they decide what is in host memory
                _drop(g, "_host")
        if top >= 0:
            self._gone(top)
        _drop(g, "_ids")
        removed = set(gone)
        object.__setattr__(g, "order", [x for x in g.order if x not in removed])
        _drop(g, "_users", "_successors", "_owner")

    def set_tensor(self, meta: TensorMeta) -> None:
        """Add or replace a tensor's meta (e.g. a view that moves to another storage)."""
        g = self._live()
        old = g._tensors.get(meta.id)
        g._tensors[meta.id] = meta
        if old is None:
            self._used(meta.id)
        elif old.storage != meta.storage:
            if g._written is None or meta.id in g._written:
                self._drop_writers()
            if g._host is not None and old.storage in g._host:
                _drop(g, "_host")
            _drop(g, "_owner")

    # ------------------------------------------------------------ control edges
    def set_control(self, nid: int, after: Iterable[int]) -> None:
        """Node `nid` runs after the nodes `after` (its whole control list; empty: none)."""
        g = self._live()
        preds = tuple(after)
        if preds:
            g._control[nid] = preds
        elif g._control.pop(nid, None) is not None:
            self._holes = True
        _drop(g, "_successors")

    def add_control(self, nid: int, after: Iterable[int]) -> None:
        """Node `nid` also runs after the nodes `after` (kept in order, without repeats)."""
        g = self._live()
        found = g._control.get(nid, ())
        more = tuple(a for a in dict.fromkeys(after) if a not in found)
        if more:
            self.set_control(nid, (*found, *more))

    # ------------------------------------------------------------ the graph's order
    def set_order(self, order: Iterable[int]) -> None:
        """The graph's own (capture) order becomes `order`."""
        g = self._live()
        object.__setattr__(g, "order", list(order))
        _drop(g, "_users", "_writers", "_written", "_owner")

    def insert_in_order(self, position: int, nodes: Sequence[int]) -> None:
        """Insert `nodes` into the graph's own order at index `position` (see splice)."""
        g = self._live()
        object.__setattr__(g, "order", splice(g.order, position, nodes))
        if any(_writes(g._nodes[n]) for n in nodes):
            self._drop_writers()
        _drop(g, "_users", "_owner")

    # ------------------------------------------------------------ the program's interface
    def set_interface(self, *, inputs: Sequence[int] | None = None,
                      input_names: Sequence[str] | None = None,
                      outputs: Sequence[int] | None = None,
                      output_names: Sequence[str] | None = None) -> None:
        """Replace the program's inputs, outputs and their names (those given)."""
        g = self._live()
        for attr, value in (("inputs", inputs), ("input_names", input_names),
                            ("outputs", outputs), ("output_names", output_names)):
            if value is not None:
                object.__setattr__(g, attr, list(value))
        if inputs is not None:
            _drop(g, "_owner", "_host")

    def set_signature(self, signature: StepSignature) -> None:
        object.__setattr__(self._live(), "signature", signature)

    def set_device(self, device: str) -> None:
        object.__setattr__(self._live(), "device", device)

    # ------------------------------------------------------------ finishing
    def finish(self) -> Graph:
        """The edited graph; the editor takes no more edits.

        Dicts something was deleted from are copied once (in order): Python copies a dict
        with holes item by item, so every later copy of the graph (each rule applied to it
        makes one) would be several times slower.
        """
        g = self._live()
        if self._holes:
            for name in ("_tensors", "_nodes", "_storages", "_control"):
                compact = dict(getattr(g, name))
                setattr(g, name, compact)
                object.__setattr__(g, name[1:], MappingProxyType(compact))
            if g._producer is not None:
                g._producer = dict(g._producer)
        self._finished = True
        return g

    def _live(self) -> Graph:
        if self._finished:
            raise GraphError("this GraphEditor has finished: start another for more edits")
        return self.graph

    def _producer_to_change(self) -> dict[int, int]:
        """The graph's producer cache, copied first when it may be shared."""
        g = self.graph
        if g._producer is None:
            raise GraphError("internal: no producer cache to change")
        if g._producer is not self._own_producer:
            g._producer = dict(g._producer)
            self._own_producer = g._producer
        return g._producer

    def _used(self, new: int) -> None:
        """Id `new` is now a node, tensor or storage of the graph (next_id's cache)."""
        g = self.graph
        if g._max_id is not None and new > g._max_id:
            object.__setattr__(g, "_max_id", new)

    def _gone(self, old: int) -> None:
        """Id `old` was deleted from one of the graph's dicts."""
        g = self.graph
        self._holes = True
        if g._max_id is not None and old >= g._max_id:
            object.__setattr__(g, "_max_id", None)

    def _drop_writers(self) -> None:
        _drop(self.graph, "_writers", "_written")
