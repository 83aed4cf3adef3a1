"""The machinery the TASO-style rules share: an Edit that builds the rewritten graph on a
peakcut.ir.edit.GraphEditor (new nodes with metas derived on FakeTensors, rewired readers,
views re-derived when the tensor they look at moves, removed nodes, control edges, storages),
the order it splices everything into, and the checks every rule runs before returning.

Metas of new tensors and of moved views come from running the ops on FakeTensors laid out like
the graph's tensors with the real storage identity (peakcut.ir.infer): a view lives in the
storage of the tensor it views, anything else in a fresh storage of the bytes its run
allocates. The shape check after a rewrite re-runs every new and rewired node and compares
with the metas the rest of the graph expects.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.infer import FakeStorages, InferenceError, Layout
from peakcut.ir.node import Node, Phase
from peakcut.ir.registry import OpKind, lookup, mutated_arguments
from peakcut.ir.tags import NodeTags
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    ancestors,
    describe_node,
    describe_tensor,
    extent_bytes,
    positions,
    writers_of,
)
from peakcut.transform.taso.tag import TasoTag


# ------------------------------------------------------------------ small queries
def is_view_op(op: str) -> bool:
    info = lookup(op)
    return info is not None and info.kind is OpKind.VIEW


def is_pure(g: Graph, nid: int) -> bool:
    """Known to the registry, not random, not a swap op, writes nothing in place."""
    n = g.nodes[nid]
    info = lookup(n.op)
    if info is None or info.random or info.kind in (OpKind.SWAP, OpKind.FACTORY):
        return False
    return not mutated_arguments(n.op)


def scalar(value: Any) -> bool:
    """A Python number usable as an op's scalar argument (bools excluded)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def same_region(a: TensorMeta, b: TensorMeta) -> bool:
    """The two tensors look at exactly the same elements in the same layout."""
    return (a.storage, a.shape, a.stride, a.storage_offset, a.dtype) == (
        b.storage, b.shape, b.stride, b.storage_offset, b.dtype)


def common_module(modules: Iterable[str]) -> str:
    parts = [m.split(".") for m in modules if m]
    if not parts:
        return ""
    prefix: list[str] = []
    for items in zip(*parts, strict=False):
        if len(set(items)) != 1:
            break
        prefix.append(items[0])
    return ".".join(prefix)


def why_not_writes(g: Graph, nodes: Sequence[int], tensors: Iterable[int],
                   before: Mapping[int, set[int]] | None = None) -> str | None:
    """Nodes that read `tensors` are merged into one: every in-place writer of those tensors'
    storages must run before all of them or after all of them (the merged node reads the
    values each of them read). None when that holds. before: ancestors of each node, if known."""
    tensors = list(tensors)
    storages = {g.tensors[t].storage for t in tensors}
    if before is None:
        before = {n: ancestors(g, n) for n in nodes}
    for s, ms in writers_of(g, storages).items():
        for m in ms:
            if m in nodes:
                return f"{describe_node(g, m)} writes what it reads in place"
            inside = [n for n in nodes if m in before[n]]
            if inside and len(inside) != len(nodes):
                t = next(t for t in tensors if g.tensors[t].storage == s)
                outside = next(n for n in nodes if n not in inside)
                return (f"{describe_node(g, m)} writes {describe_tensor(g, t)} in place after "
                        f"{describe_node(g, outside)} reads it but before "
                        f"{describe_node(g, inside[0])} does: they do not read the same values")
    return None


# ------------------------------------------------------------------ fake execution
def run_fake(g: Graph, node: Node, fakes: FakeStorages | None = None) -> list[Layout | None]:
    """The layouts of `node`'s results run on FakeTensors laid out like g's metas of its inputs
    (peakcut.ir.infer: real storage identity), listed like node.outputs; a RuleError naming
    the node when the op rejects those inputs or has no fake kernel. fakes: the fake storages
    to run on (default: new ones)."""
    try:
        return (FakeStorages() if fakes is None else fakes).layouts(g, node.op, node.args,
                                                                    node.kwargs)
    except InferenceError as e:
        raise _failure(node.name or str(node.id), node.op, e) from None


def _failure(name: str, op: str, e: InferenceError) -> RuleError:
    if isinstance(e.cause, NotImplementedError):
        return RuleError(f"node {name} ({op}) has no fake kernel: its outputs cannot be derived "
                         "for new inputs")
    text = str(e.cause).strip()
    first = text.splitlines()[0] if text else type(e.cause).__name__
    return RuleError(f"node {name} ({op}) would fail on its new inputs: {first}")


def meta_of(layout: Layout, tid: int, role: Role, name: str) -> TensorMeta:
    """The meta of an existing tensor (id, role, name kept) with a layout of peakcut.ir.infer."""
    shape, stride, dtype, offset, source = layout
    if source[0] != "in":
        raise RuleError(f"internal: tensor {name or tid} would move to a new storage")
    return TensorMeta(tid, shape, stride, dtype, source[1], offset, role, name)


# ------------------------------------------------------------------ the edit
class Edit:
    """A rewritten copy of `g` under construction (g itself is never touched)."""

    def __init__(self, g: Graph, order: Sequence[int], rule: str) -> None:
        self.g = g
        self.order = list(order)
        self.rule = rule
        self.editor = GraphEditor(g)
        self.new = self.editor.graph
        self.added: list[int] = []
        self.removed: list[int] = []
        self.changed: dict[int, None] = {}
        self.replaced_by: dict[int, tuple[int, ...]] = {}   # removed node -> its stand-ins
        self.inherit: dict[int, tuple[int, ...]] = {}       # new node -> nodes whose control it takes
        self.moved_storages: set[int] = set()               # storages that may have emptied
        self.principals: list[int] = []                     # nodes of g the new ones stand for
        self._pos: tuple[dict[int, int], dict[int, int]] | None = None

    def runs_before(self, a: int, b: int) -> bool:
        """Node a comes before node b (both of the input graph) in both orders."""
        if self._pos is None:
            self._pos = (positions(self.order), positions(self.g.order))
        return all(a in p and b in p and p[a] < p[b] for p in self._pos)

    # -------------------------------------------------------------- building
    def add(self, op: str, args: tuple, kwargs: Mapping[str, Any] | None = None, *,
            name: str, phase: Phase, module: str, tag: TasoTag | None = None,
            multi_output: bool = False, outputs: Sequence[int | None] | None = None) -> Node:
        """A new node calling `op`; its outputs' metas are derived on FakeTensors. outputs: per
        output, a tensor of the graph the node makes from now on (its layout must come out
        the same; the node that made it is removed with `remove(..., handed_on=...)`), or
        None for a new tensor."""
        try:
            node = self.editor.add_op(op, tuple(args), dict(kwargs or {}), name=name, phase=phase,
                                      module=module, tags=NodeTags(tag or TasoTag(self.rule)),
                                      multi_output=multi_output, tensor_ids_first=True,
                                      outputs=outputs)
        except InferenceError as e:
            raise _failure(name, op, e) from None
        except GraphError as e:
            raise RuleError(f"node {name} ({op}) cannot make the tensor it stands for: {e}") from None
        # Graph.users walks the order: the new node goes last until the final order is set
        self.editor.insert_in_order(len(self.new.order), [node.id])
        self.added.append(node.id)
        return node

    def rewire(self, nid: int, mapping: Mapping[int, int]) -> None:
        """Node `nid` reads mapping[t] in place of t (and is reported as changed)."""
        if not self.editor.rewire(nid, mapping):
            return
        if nid not in self.added:
            self.changed[nid] = None

    def replace_args(self, nid: int, args: tuple, kwargs: Mapping[str, Any] | None = None) -> None:
        old = self.new.nodes[nid]
        node = Node(id=old.id, op=old.op, args=tuple(args),
                    kwargs=dict(old.kwargs if kwargs is None else kwargs), outputs=old.outputs,
                    multi_output=old.multi_output, module=old.module, phase=old.phase,
                    name=old.name, tags=old.tags)
        self.editor.replace_node(node)
        if nid not in self.added:
            self.changed[nid] = None

    def redirect(self, mapping: Mapping[int, int]) -> list[int]:
        """Every reader of a tensor t in `mapping` reads mapping[t] instead; the readers."""
        touched: dict[int, None] = {}
        for t in mapping:
            for u in list(self.new.users(t)):
                touched[u] = None
        for u in touched:
            self.rewire(u, mapping)
        return list(touched)

    def remove(self, nid: int, stand_ins: Sequence[int] = (), handed_on: Iterable[int] = ()) -> None:
        """Remove node `nid`; in control lists it is replaced by `stand_ins`. Its outputs must
        be unused by now, except `handed_on`: tensors a new node makes instead (Edit.add's
        outputs), which stay."""
        n = self.new.nodes[nid]
        kept = set(handed_on)
        for t in n.output_ids():
            if t in kept:
                continue
            self.moved_storages.add(self.new.tensors[t].storage)
            if t in self.new.outputs:
                raise RuleError(f"internal: {describe_tensor(self.new, t)} is a program output")
        if kept:
            unused = [t for t in n.output_ids() if t not in kept and self.new.users(t)]
            if unused:
                raise RuleError(f"internal: {describe_tensor(self.new, unused[0])} is still read")
            self.editor.remove_nodes([nid], keep_tensors=kept)
        else:
            self.editor.remove_node(nid)
        self.changed.pop(nid, None)
        if nid in self.added:
            self.added.remove(nid)
        else:
            self.removed.append(nid)
        self.replaced_by[nid] = tuple(stand_ins)

    def remove_dead(self, seeds: Iterable[int]) -> None:
        """Remove pure nodes among `seeds` (and, transitively, their producers) whose outputs
        nobody reads any more and which are no program outputs."""
        stack = [s for s in seeds if s is not None]
        outputs = set(self.new.outputs)
        while stack:
            nid = stack.pop()
            if nid not in self.new.nodes or not is_pure(self.new, nid):
                continue
            outs = self.new.nodes[nid].output_ids()
            if any(self.new.users(t) or t in outputs for t in outs):
                continue
            producers = [self.new.producer(t) for t in self.new.nodes[nid].input_ids()]
            self.remove(nid)
            stack.extend(p for p in producers if p is not None)

    # -------------------------------------------------------------- views that move
    def rederive(self, start: Iterable[int]) -> None:
        """The nodes `start` read tensors whose layout or storage changed: re-run them (and,
        for views, everything reading their outputs) on FakeTensors. Views take the derived
        meta (storage of the tensor they view); other ops must keep their outputs' shape and
        dtype, and take a new stride only when their storage still holds it."""
        queue = list(dict.fromkeys(start))
        seen: set[int] = set()
        while queue:
            nid = queue.pop(0)
            if nid in seen or nid not in self.new.nodes:
                continue
            seen.add(nid)
            node = self.new.nodes[nid]
            if self.new.is_opaque(nid):
                raise RuleError(f"{describe_node(self.new, nid)} is opaque to peakcut: its "
                                "outputs cannot be re-derived for the new layout of its inputs")
            results = run_fake(self.new, node, self.editor.fakes)
            if len(results) != len(node.outputs):
                raise RuleError(f"internal: {describe_node(self.new, nid)} returns "
                                f"{len(results)} values, graph says {len(node.outputs)}")
            view = is_view_op(node.op)
            for t, out in zip(node.outputs, results, strict=True):
                if t is None or out is None:
                    continue
                old = self.new.tensors[t]
                if view:
                    meta = meta_of(out, t, old.role, old.name)
                    if meta == old:
                        continue
                    if (meta.shape, meta.dtype) != (old.shape, old.dtype):
                        raise RuleError(f"{describe_node(self.new, nid)} would return "
                                        f"{meta.shape}/{meta.dtype} instead of "
                                        f"{old.shape}/{old.dtype}")
                    self.moved_storages.add(old.storage)
                    self.editor.set_tensor(meta)
                    queue.extend(self.new.users(t))
                    continue
                shape, stride, dtype = out[0], out[1], out[2]
                if (shape, dtype) != (old.shape, old.dtype):
                    raise RuleError(f"{describe_node(self.new, nid)} would return "
                                    f"{shape}/torch.{dtype} instead of {old.shape}/{old.dtype}")
                if stride != old.stride:
                    meta = TensorMeta(t, old.shape, stride, old.dtype, old.storage,
                                      old.storage_offset, old.role, old.name)
                    if extent_bytes(meta) > self.new.storages[old.storage]:
                        raise RuleError(f"{describe_node(self.new, nid)} would lay out its "
                                        f"output with stride {stride}, past its storage")
                    self.editor.set_tensor(meta)
                    queue.extend(self.new.users(t))

    # -------------------------------------------------------------- finishing
    def _fix_control(self) -> None:
        """Removed nodes are replaced by their stand-ins in control lists; new nodes inherit
        the control predecessors of the nodes they stand for; every in-place writer of a
        storage a new node reads, that does not run before it, waits for it."""
        new = self.new
        removed = set(self.removed)
        for m, preds in list(new.control.items()):
            if m in removed or not any(p in removed for p in preds):
                continue
            keep = [p for p in preds if p not in removed]
            for p in preds:
                if p in removed:
                    keep.extend(self.replaced_by.get(p, ()))
            self._set_control(m, keep)
        for a, originals in self.inherit.items():
            inherited = [p for o in originals for p in self.g.control.get(o, ())
                         if p not in removed and p != a]
            if inherited:
                self._set_control(a, [*new.control.get(a, ()), *inherited])
        reads = {a: {new.tensors[t].storage for t in new.nodes[a].input_ids()}
                 for a in self.added}
        storages = set().union(*reads.values()) if reads else set()
        written = writers_of(new, storages)
        if not written:
            return
        earlier: set[int] = set()
        for p in self.principals:
            earlier |= ancestors(self.g, p)
        before: dict[int, set[int]] = {}
        for s, ms in written.items():
            for m in ms:
                for a in self.added:
                    if s not in reads[a] or m == a:
                        continue
                    if m in earlier:      # a write the originals saw: the new reader waits
                        if a not in before:
                            before[a] = ancestors(new, a)
                        if m not in before[a]:
                            self._set_control(a, [*new.control.get(a, ()), m])
                            before[a] |= {m} | ancestors(new, m)
                    elif not any(w in new.predecessors(m) for w in ms if w not in earlier):
                        # a later write waits for the new reader; in a chain of later in-place
                        # writes (each reading the result of the one before) the first does
                        self._set_control(m, [*new.control.get(m, ()), a])

    def _set_control(self, m: int, preds: Iterable[int]) -> None:
        new = self.new
        before = tuple(new.control.get(m, ()))
        after = tuple(sorted(set(p for p in preds if p != m and p in new.nodes)))
        if after == tuple(sorted(set(before))):
            return
        self.editor.set_control(m, after)
        if m not in self.added:
            self.changed[m] = None

    def _drop_empty_storages(self) -> None:
        self.editor.remove_unused_storages(self.moved_storages)

    def _place(self, order: Sequence[int], principals: Sequence[int]) -> list[int]:
        """`order` without the removed nodes and with the added ones where the last of
        `principals` (nodes of the input graph the new nodes stand for) was; nodes between the
        first and the last principal that now depend on a new node move after the new ones."""
        pos = positions(order)
        removed = set(self.removed)
        if principals:
            first = min(pos[p] for p in principals)
            last = max(pos[p] for p in principals)
        else:
            first = last = len(order)
        new = self.new
        between = {order[i] for i in range(first, min(last, len(order)))
                   if order[i] not in removed}
        late: set[int] = set()
        frontier = list(self.added)
        while frontier:
            nid = frontier.pop()
            for s in new.successors(nid):
                if s in between and s not in late:
                    late.add(s)
                    frontier.append(s)
        head = [n for n in order[:last] if n not in removed and n not in late]
        moved = [n for n in order[:last] if n in late]
        tail = [n for n in order[last:] if n not in removed]
        return [*head, *self.added, *moved, *tail]

    def finish(self, principals: Sequence[int], description: str,
               check: Iterable[int] = ()) -> Rewrite:
        """Control edges, storages, both orders, the shape check; the Rewrite."""
        self.principals = list(principals)
        self._fix_control()
        self._drop_empty_storages()
        new = self.new
        order = self._place(self.order, principals)
        self.editor.set_order(self._place(self.g.order, principals))
        for name, o in (("the order", order), ("the capture order", new.order)):
            problem = order_problem(new, o)
            if problem:
                raise RuleError(f"{problem} in {name} after the rewrite (a cycle?)")
        shape_check(new, [*self.added, *self.changed, *check], self.editor.fakes)
        return Rewrite(graph=self.editor.finish(), order=order, added=tuple(self.added),
                       changed=tuple(n for n in self.changed if n in new.nodes),
                       removed=tuple(self.removed), description=description)


# ------------------------------------------------------------------ checks
def order_problem(g: Graph, order: Sequence[int]) -> str | None:
    """Why `order` is not a topological order of g (None when it is)."""
    if len(order) != len(g.nodes) or g.nodes.keys() != set(order):
        return f"the order has {len(order)} nodes, the graph {len(g.nodes)}"
    pos = positions(order)
    producer = g.producer_map()
    nodes, control = g.nodes, g.control
    for nid in order:   # Graph.predecessors, inlined: it builds a set per node
        here = pos[nid]
        for t in nodes[nid].input_tuple:
            p = producer.get(t)
            if p is not None and p != nid and pos[p] > here:
                return f"{describe_node(g, nid)} comes before {describe_node(g, p)}"
        for p in control.get(nid, ()):
            if p != nid and pos[p] > here:
                return f"{describe_node(g, nid)} comes before {describe_node(g, p)}"
    return None


def shape_check(g: Graph, nodes: Iterable[int], fakes: FakeStorages | None = None) -> None:
    """Re-run `nodes` on FakeTensors of their inputs' metas: every output must have the
    shape, dtype and stride the graph records (views also the storage offset). fakes: the
    fake storages of g to run on (default: new ones)."""
    fakes = FakeStorages() if fakes is None else fakes
    for nid in dict.fromkeys(nodes):
        if nid not in g.nodes or g.is_opaque(nid):
            continue
        node = g.nodes[nid]
        results = run_fake(g, node, fakes)
        if len(results) != len(node.outputs):
            raise RuleError(f"shape check: {describe_node(g, nid)} returns {len(results)} "
                            f"values, the graph says {len(node.outputs)}")
        for t, out in zip(node.outputs, results, strict=True):
            if t is None or out is None:
                continue
            meta = g.tensors[t]
            got = (out[0], out[1], out[2])
            if got != (meta.shape, meta.stride, meta.dtype) or (
                    is_view_op(node.op) and out[3] != meta.storage_offset):
                raise RuleError(f"shape check: {describe_node(g, nid)} gives {got[0]} stride "
                                f"{got[1]} {got[2]}, the graph expects {meta.shape} stride "
                                f"{meta.stride} {meta.dtype} for {describe_tensor(g, t)}")
