"""What every rule returns (Rewrite), how it refuses (RuleError), and the graph helpers the
scheduling-based rules share: ancestry, in-place writers of a storage, naming for messages,
and moving the views a rewired node creates into a new storage.

Rules are pure: they edit a copy of the graph through peakcut.ir.edit.GraphEditor and never
touch their input. The new graph's own Graph.order (its capture/default order) gets the new
nodes spliced in by the same rule as the Rewrite's order, so both stay valid topological
orders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.tags import Tag
from peakcut.ir.tensor import TensorMeta


class RuleError(ValueError):
    """A rule was applied where it does not apply; the message says why (tensor, node, module)."""


@dataclass(frozen=True)
class Rewrite:
    """The result of applying a rule.

    graph: the new graph (the input graph is untouched).
    order: a valid topological order of the new graph: the input order with the new nodes
        spliced in and the removed ones taken out.
    added: ids of the nodes the rule added.
    changed: ids of existing nodes whose dependencies changed: inputs rewired or control
        edges added/removed (what an incremental scheduler must look at again).
    removed: ids of the nodes the rule removed.
    description: one line saying what was done, naming tensors, nodes and modules.
    """

    graph: Graph
    order: list[int]
    added: tuple[int, ...]
    changed: tuple[int, ...]
    removed: tuple[int, ...]
    description: str


@dataclass(frozen=True, slots=True)
class RewrittenFromTag(Tag):
    """A node a rewrite made in place of an op `op` it replaced (the loss rewrite,
    peakcut.fission.loss; split_batch_norms, peakcut.transform.batch_norm)."""

    kind: ClassVar[str] = "rewritten_from"
    op: str

    def to_json(self) -> str:
        return self.op

    @classmethod
    def from_json(cls, doc: Any) -> RewrittenFromTag:
        return cls(str(doc))

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> RewrittenFromTag | None:
        return cls(str(extra["rewritten_from"])) if "rewritten_from" in extra else None


def compose_rewrites(g: Graph, steps: Sequence[Rewrite], description: str) -> Rewrite:
    """One Rewrite of g for `steps`, rewrites applied one after the other (each to the graph
    the one before made): the last graph and order; added the new nodes still there, removed
    the nodes of g gone, changed the nodes of g still there that some step changed."""
    if not steps:
        raise ValueError("no rewrite to compose")
    last = steps[-1].graph
    added = [a for s in steps for a in s.added if a in last.nodes and a not in g.nodes]
    removed = [r for s in steps for r in s.removed if r in g.nodes and r not in last.nodes]
    changed = [c for s in steps for c in s.changed if c in g.nodes and c in last.nodes]
    return Rewrite(graph=last, order=list(steps[-1].order), added=tuple(dict.fromkeys(added)),
                   changed=tuple(dict.fromkeys(changed)), removed=tuple(dict.fromkeys(removed)),
                   description=description)


# ------------------------------------------------------------------ naming
def describe_node(g: Graph, nid: int) -> str:
    """'node mm_3 (aten.mm.default) in encoder.layer.0' for messages."""
    n = g.nodes[nid]
    where = f" in {n.module}" if n.module else ""
    return f"node {n.name or nid} ({n.op}){where}"


def describe_users(g: Graph, users: Sequence[int], shown: int = 4) -> str:
    """'mm_3, add_1 and 2 more' for messages."""
    names = ", ".join(g.nodes[u].name or str(u) for u in users[:shown])
    return names + (f" and {len(users) - shown} more" if len(users) > shown else "")


def describe_tensor(g: Graph, tid: int) -> str:
    """'tensor mm_3 (id 17, activation, 4x64 float32)' for messages."""
    t = g.tensors[tid]
    shape = "x".join(str(s) for s in t.shape) or "scalar"
    return f"tensor {t.name or tid} (id {tid}, {t.role.value}, {shape} {t.dtype})"


# ------------------------------------------------------------------ structure
def ancestors(g: Graph, nid: int) -> set[int]:
    """Every node that must run before `nid` (data and control dependencies, transitively)."""
    producer = g.producer_map()
    nodes = g.nodes
    control = g.control
    seen: set[int] = set()
    stack = list(g.predecessors(nid))
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        # g.predecessors(p), inlined: producers of p's inputs and p's control dependencies
        for t in nodes[p].input_tuple:
            q = producer.get(t)
            if q is not None and q not in seen:
                stack.append(q)
        stack.extend(control.get(p, ()))
    return seen


def writers_of(g: Graph, storages: Iterable[int]) -> dict[int, list[int]]:
    """Storage -> nodes that write it in place (in capture order), for the given storages."""
    return {s: list(found) for s in set(storages) if (found := g.storage_writers(s))}


def positions(order: Sequence[int]) -> dict[int, int]:
    """Node id -> index in `order` (the last one for a repeated id)."""
    return dict(zip(order, range(len(order)), strict=False))


def check_order_matches(g: Graph, order: Sequence[int]) -> str | None:
    """Why `order` cannot be an order of `g` (None when it is a permutation of g's nodes)."""
    if len(order) != len(g.nodes) or set(order) != g.node_ids():
        return f"the order has {len(order)} nodes but the graph has {len(g.nodes)} (a stale order?)"
    return None


def node_calling(g: Graph, order: Sequence[int], nid: int, op: str, what_it_is: str, *,
                 checked: bool = False) -> Node | str:
    """Node `nid` of g when it calls `op` (and `order` is an order of g, unless the caller has
    `checked` that); else why not: "node ... is not <what_it_is>"."""
    stale = None if checked else check_order_matches(g, order)
    if stale:
        return stale
    if nid not in g.nodes:
        return f"no node {nid}"
    node = g.nodes[nid]
    if node.op != op:
        return f"{describe_node(g, nid)} is not {what_it_is}"
    return node


def check_candidate_query(g: Graph, order: Sequence[int], kinds: Sequence[str],
                          known: Sequence[str], limit: int, what: str) -> None:
    """ValueError for unknown candidate kinds, a negative limit or an order of another graph."""
    unknown = [k for k in kinds if k not in known]
    if unknown:
        raise ValueError(f"unknown {what} kinds {unknown}; known: {tuple(known)}")
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    stale = check_order_matches(g, order)
    if stale:
        raise ValueError(stale)


def program_output_storages(g: Graph) -> set[int]:
    return {g.tensors[t].storage for t in g.outputs}


# ------------------------------------------------------------------ identity views
IDENTITY_VIEWS = frozenset({"aten.detach.default", "aten.alias.default"})
"""Views that are their input: the same storage, shape, strides, offset and dtype. The autograd
capture reads a tensor saved for the backward through the forward's detach of it."""


def _identity_input(g: Graph, tensor: int) -> int | None:
    """The tensor `tensor` is an identity view of (one step), or None."""
    producer = g.producer(tensor)
    if producer is None:
        return None
    n = g.nodes[producer]
    if n.op not in IDENTITY_VIEWS or not n.args or not isinstance(n.args[0], TensorRef):
        return None
    view, source = g.tensors[tensor], g.tensors[n.args[0].id]
    same = (view.storage, view.shape, view.stride, view.storage_offset, view.dtype) == (
        source.storage, source.shape, source.stride, source.storage_offset, source.dtype)
    return source.id if same else None


def identity_source(g: Graph, tensor: int) -> int:
    """The tensor `tensor` stands for through identity views (IDENTITY_VIEWS): itself if none."""
    while (source := _identity_input(g, tensor)) is not None:
        tensor = source
    return tensor


def identity_views(g: Graph, tensor: int) -> list[int]:
    """The identity views of `tensor` (and of those, transitively), in graph order of discovery."""
    found: list[int] = []
    frontier = [tensor]
    while frontier:
        t = frontier.pop()
        for u in g.users(t):
            for v in g.nodes[u].output_ids():
                if v not in found and _identity_input(g, v) == t:
                    found.append(v)
                    frontier.append(v)
    return found


# ------------------------------------------------------------------ moving views
def reads_any(node: Node, tensors: Iterable[int]) -> bool:
    wanted = set(tensors)
    return any(t in wanted for t in node.input_ids())


@dataclass(frozen=True)
class StorageMove:
    """Tensors created by rewired nodes as views of an old storage, to live in a new one.

    When a rewired user is a view op (t, view, expand, ...), its output aliases the tensor it
    reads; once it reads the recomputed/loaded copy, that view (and views of it) live in the
    copy's storage, at the same position relative to the copy as before relative to the
    original: their byte offset drops by shift_bytes (0 for a recompute, the original's byte
    offset for a load, whose copy starts at offset 0).
    """

    old_storage: int
    new_storage: int
    shift_bytes: int       # new byte offset = old byte offset - shift_bytes
    tensors: tuple[int, ...]


def alias_closure(g: Graph, storage: int, seeds: Iterable[int]) -> list[int]:
    """Tensors in `storage` produced by the nodes `seeds` or, transitively, by nodes reading
    such tensors (views of views, and the outputs of in-place writes of them), in a stable
    order: what follows a rewired node into a new storage."""
    found: dict[int, None] = {}
    frontier = list(seeds)
    seen_nodes: set[int] = set()
    while frontier:
        nid = frontier.pop(0)
        if nid in seen_nodes:
            continue
        seen_nodes.add(nid)
        for t in g.nodes[nid].output_ids():
            if g.tensors[t].storage == storage and t not in found:
                found[t] = None
                frontier.extend(g.users(t))
    return list(found)


def moved_meta(meta: TensorMeta, new_storage: int, shift_bytes: int) -> TensorMeta | None:
    """meta re-homed to new_storage with its byte offset reduced by shift_bytes; None when the
    shift is not a whole number of elements or the offset would become negative."""
    if shift_bytes % meta.itemsize:
        return None
    offset = meta.storage_offset - shift_bytes // meta.itemsize
    if offset < 0:
        return None
    return TensorMeta(meta.id, meta.shape, meta.stride, meta.dtype, new_storage, offset, meta.role,
                      meta.name)


def extent_bytes(meta: TensorMeta) -> int:
    """Bytes from the start of the storage to one past the tensor's last element."""
    if meta.numel == 0:
        return 0
    last = meta.storage_offset + sum((s - 1) * abs(st) for s, st in zip(meta.shape, meta.stride,
                                                                         strict=True))
    return (last + 1) * meta.itemsize


def why_not_move(g: Graph, tensors: Iterable[int], new_bytes: int, shift_bytes: int) -> str | None:
    """Why these views cannot be re-homed into a storage of new_bytes (None when they can)."""
    for t in tensors:
        meta = g.tensors[t]
        moved = moved_meta(meta, -1, shift_bytes)
        if moved is None or extent_bytes(moved) > new_bytes:
            return (f"{describe_tensor(g, t)} is a view reaching outside the copied tensor; "
                    "it cannot follow the copy")
        if t in g.outputs:
            return f"{describe_tensor(g, t)} is a view of it and a program output"
    return None


def apply_moves(edit: GraphEditor, moves: Iterable[StorageMove]) -> None:
    """Re-home the tensors of each move in the graph being edited."""
    g = edit.graph
    for move in moves:
        for t in move.tensors:
            meta = moved_meta(g.tensors[t], move.new_storage, move.shift_bytes)
            if meta is None:  # guarded by why_not_move in every rule
                raise RuleError(f"internal: {describe_tensor(g, t)} cannot be re-homed")
            edit.set_tensor(meta)


def spliced(sequence: Sequence[int], removed: Iterable[int] = (), after: Mapping[int, Sequence[int]] | None = None,
            before: Mapping[int, Sequence[int]] | None = None) -> list[int]:
    """`sequence` without the nodes `removed`, and with new nodes added, in one pass (a batched
    rule's many insertions): a node of `before` right before the first of its nodes there, a
    node of `after` right after the last of its nodes there (at the start when none is). New
    nodes at one place are where inserting them one at a time puts them: before one node in
    the order of `before`, after one node in the reverse order of `after`. The sequence is
    copied in slices between the places (a 25k-node order, hundreds of times per rule)."""
    pos = positions(sequence)
    gaps: dict[int, tuple[list[int], list[int]]] = {}   # gap i (before sequence[i]) -> (after, before)
    for new, anchors in (before or {}).items():
        gap = min((pos[q] for q in anchors if q in pos), default=len(sequence))
        gaps.setdefault(gap, ([], []))[1].append(new)
    for new, anchors in (after or {}).items():
        gap = max((pos[q] for q in anchors if q in pos), default=-1) + 1
        gaps.setdefault(gap, ([], []))[0].append(new)
    gone = set(removed)

    def kept(part: Sequence[int]) -> Sequence[int]:
        return [v for v in part if v not in gone] if gone else part

    out: list[int] = []
    start = 0
    for gap in sorted(gaps):
        out.extend(kept(sequence[start:gap]))
        behind, ahead = gaps[gap]
        out.extend(reversed(behind))
        out.extend(ahead)
        start = gap
    out.extend(kept(sequence[start:]))
    return out
