"""Gather a sharded parameter again for its later readers (FSDP2's reshard after forward).

An FSDP2 step (capture.fully_sharded) all-gathers each parameter from the ranks' shards
into a full tensor T: `A = all_gather_into_tensor(shard)`, `W = wait_collective(T)`, then
views of T that the forward and the backward read. T lives from the gather to its last
reader in the backward. `regather` gives `users` (typically the backward's readers) their
own gather of the same shard: A' and its wait W' make T' in a fresh storage, the views the
users read are made again of T', and the users read those; T is freed after its other
readers. The shard is a step input, alive throughout, and an all-gather of it is the same
bytes every time (every rank runs the same plan, so every rank gathers again), so the users
read what they read before: the numbers do not change.

New nodes carry RegatherTag(of=A): the rule places the gather hidden (early enough that
compute hides it) and the wait and views late (right before their first reader).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from peakcut.ir.collectives import ALL_GATHER_OP, WAIT_OP
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase, TensorRef, map_refs
from peakcut.ir.registry import OpKind, lookup
from peakcut.ir.tags import FissionTag, NodeTags, Tag
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    check_order_matches,
    describe_node,
    describe_users,
    positions,
)


@dataclass(frozen=True, slots=True)
class RegatherTag(Tag):
    """A node of a second gather of all-gather node `of` (the gather, its wait or a view)."""

    kind: ClassVar[str] = "regather"
    of: int

    def to_json(self) -> dict[str, Any]:
        return {"of": self.of}

    @classmethod
    def from_json(cls, doc: Any) -> RegatherTag:
        return cls(int(doc["of"]))


@dataclass(frozen=True)
class _Gather:
    node: int                  # the all-gather A
    full: int                  # its output T
    wait: int                  # W
    storage: int               # T's storage


def _gather(g: Graph, node: int) -> _Gather | str:
    if node not in g.nodes:
        return f"node {node} is not in the graph"
    n = g.nodes[node]
    if n.op != ALL_GATHER_OP:
        return f"{describe_node(g, node)} is not an all-gather"
    full = n.outputs[0]
    if full is None:
        return f"{describe_node(g, node)} has no output"
    storage = g.tensors[full].storage
    waits = [u for u in g.users(full) if g.nodes[u].op == WAIT_OP]
    if len(waits) != 1:
        return f"{describe_node(g, node)} is waited for {len(waits)} times, not once"
    if g.storage_writers(storage) != [waits[0]]:
        return f"the gathered tensor of {describe_node(g, node)} is written by more than its wait"
    return _Gather(node, full, waits[0], storage)


def _is_view(g: Graph, nid: int) -> bool:
    info = lookup(g.nodes[nid].op)
    return info is not None and info.kind is OpKind.VIEW


def _chain(g: Graph, tensor: int, gathered: _Gather) -> list[int] | str:
    """The view nodes from T to `tensor` (in that order), or why `tensor` is not a view of T."""
    chain: list[int] = []
    while tensor != gathered.full:
        p = g.producer(tensor)
        if p is None or not _is_view(g, p):
            return f"tensor {tensor} reads the gathered storage but is not a view of it"
        chain.append(p)
        sources = [t for t in g.nodes[p].input_tuple if g.tensors[t].storage == gathered.storage]
        if len(sources) != 1:
            return f"{describe_node(g, p)} views the gathered storage through {len(sources)} tensors"
        tensor = sources[0]
    return chain[::-1]


def _why_not(g: Graph, order: Sequence[int], node: int, users: Sequence[int]) -> tuple[_Gather, list[int]] | str:
    stale = check_order_matches(g, order)
    if stale:
        return stale
    gathered = _gather(g, node)
    if isinstance(gathered, str):
        return gathered
    if not users:
        return "no readers to gather again for"
    pos = positions(order)
    for u in users:
        if u not in g.nodes:
            return f"node {u} is not in the graph"
        if _is_view(g, u) or g.nodes[u].op == WAIT_OP:
            return f"{describe_node(g, u)} is a view or a wait, not a reader of the gathered data"
        if pos[u] < pos[gathered.wait]:
            return f"{describe_node(g, u)} runs before the gather is waited for"
        for t in g.nodes[u].input_tuple:
            if g.tensors[t].storage == gathered.storage:
                chain = _chain(g, t, gathered)
                if isinstance(chain, str):
                    return chain
    chosen = set(users)
    others = [r for r in _readers(g, gathered) if r not in chosen]
    if not others:
        return f"every reader of {describe_node(g, node)} is among the users: nothing is freed earlier"
    return gathered, sorted(users, key=pos.__getitem__)


def _readers(g: Graph, gathered: _Gather) -> list[int]:
    """The nodes that read the gathered data: readers of T and of its views (found through
    the views, not by a walk of the whole graph), not the views themselves or the wait."""
    found: list[int] = []
    seen: set[int] = set()
    tensors = [gathered.full]
    while tensors:
        for nid in g.users(tensors.pop()):
            if nid in seen or nid in (gathered.node, gathered.wait):
                continue
            seen.add(nid)
            if _is_view(g, nid):
                tensors.extend(t for t in g.nodes[nid].output_tuple if g.tensors[t].storage == gathered.storage)
            else:
                found.append(nid)
    return found


def backward_readers(g: Graph, node: int) -> tuple[int, ...]:
    """The readers of all-gather `node`'s data that run in the backward (the recomputes of
    checkpointed blocks included), by node id; none where `node` is not a gather this
    transform takes or where every reader is in the backward (nothing would be freed
    earlier). Fission part copies are left out: a region reads what its base reads."""
    gathered = _gather(g, node)
    if isinstance(gathered, str):
        return ()
    readers = _readers(g, gathered)
    found = [r for r in readers if g.nodes[r].phase is Phase.BACKWARD and g.nodes[r].tags.get(FissionTag) is None]
    return tuple(sorted(found)) if len(found) < len(readers) else ()


def why_not_regather(g: Graph, order: Sequence[int], node: int, users: Sequence[int]) -> str | None:
    """Why `users` cannot read a second gather of all-gather `node` (None when they can)."""
    found = _why_not(g, order, node, users)
    return found if isinstance(found, str) else None


def regather(g: Graph, order: Sequence[int], node: int, users: Sequence[int]) -> Rewrite:
    """`users` read their own gather of all-gather `node`'s shard (module doc); RuleError
    (why_not_regather's reason) where it does not apply."""
    rewrite, reasons = regather_many(g, order, [(node, users)])
    if rewrite is None:
        raise RuleError(reasons[0] or "regather does not apply")
    return rewrite


def regather_many(g: Graph, order: Sequence[int], sites: Sequence[tuple[int, Sequence[int]]]
                  ) -> tuple[Rewrite | None, list[str | None]]:
    """Each (all-gather node, users) of `sites` where it applies, in one edit (each gather is
    its own parameter's: the sites are independent); also, per site, why it does not apply
    (None: applied)."""
    reasons: list[str | None] = []
    found: list[tuple[_Gather, list[int]]] = []
    seen: set[int] = set()
    for node, users in sites:
        checked = _why_not(g, order, node, users) if node not in seen else "the same all-gather twice"
        reasons.append(checked if isinstance(checked, str) else None)
        if not isinstance(checked, str):
            found.append(checked)
            seen.add(node)
    if not found:
        return None, reasons
    edit = GraphEditor(g)
    before: dict[int, list[int]] = {}        # first user -> the nodes added right before it
    old_views: list[int] = []
    changed: list[int] = []
    for gathered, users in found:
        added, views = _twin(edit, g, gathered, users)
        before.setdefault(users[0], []).extend(added)
        old_views.extend(views)
        changed.extend(users)
    edit.set_order(_spliced(g.order, before))
    # the forward's views nobody reads now: gone, so they keep T alive no longer
    removed = _unread(edit.graph, old_views)
    if removed:
        edit.remove_nodes(removed)
    gone = set(removed)
    added_all = tuple(n for nodes in before.values() for n in nodes)
    names = [describe_node(g, gathered.node) for gathered, _ in found]
    what = (f"gather {names[0]} again for {describe_users(g, found[0][1])}" if len(found) == 1
            else f"gather {len(found)} parameters again for their readers in the backward")
    return Rewrite(graph=edit.finish(), order=[n for n in _spliced(order, before) if n not in gone],
                   added=added_all, changed=tuple(dict.fromkeys(changed)), removed=tuple(removed),
                   description=what), reasons


def _spliced(order: Sequence[int], before: dict[int, list[int]]) -> list[int]:
    """`order` with before[x] right before each x."""
    out: list[int] = []
    for n in order:
        out.extend(before.get(n, ()))
        out.append(n)
    return out


def _twin(edit: GraphEditor, g: Graph, gathered: _Gather, users: Sequence[int]) -> tuple[list[int], list[int]]:
    """A second gather for `users` added to `edit` (the gather, its wait, the views the users
    read, rewired): the nodes added, in order, and the forward's views the users read before."""
    a = g.nodes[gathered.node]
    first = g.nodes[users[0]]
    tags = NodeTags(RegatherTag(gathered.node))
    a2 = edit.add_op(a.op, a.args, dict(a.kwargs), name=f"{a.name}_again", phase=first.phase, module=a.module,
                     tags=tags)
    full2 = a2.outputs[0]
    if full2 is None:
        raise RuleError(f"{describe_node(g, gathered.node)} again made no tensor")
    w = g.nodes[gathered.wait]
    w2 = edit.add_op(w.op, (TensorRef(full2), *w.args[1:]), {}, name=f"{w.name}_again", phase=first.phase,
                     module=w.module, tags=tags)
    added = [a2.id, w2.id]
    made: dict[int, int] = {gathered.full: full2}        # old tensor -> its twin of T'
    old_views: list[int] = []
    for u in users:
        mapping: dict[int, int] = {}
        for t in g.nodes[u].input_tuple:
            if g.tensors[t].storage != gathered.storage:
                continue
            chain = _chain(g, t, gathered)
            if isinstance(chain, str):            # (checked by _why_not)
                raise RuleError(chain)
            for v in chain:
                out = g.nodes[v].outputs[0]
                if out is None or out in made:
                    continue
                view = g.nodes[v]
                args = map_refs(view.args, lambda r: TensorRef(made.get(r.id, r.id)))
                v2 = edit.add_op(view.op, args, dict(view.kwargs), name=f"{view.name}_again", phase=first.phase,
                                 module=view.module, tags=tags)
                edit.add_control(v2.id, [w2.id])
                twin = v2.outputs[0]
                if twin is None:
                    raise RuleError(f"{describe_node(g, v)} again made no tensor")
                made[out] = twin
                added.append(v2.id)
                old_views.append(v)
            mapping[t] = made[t]
        edit.rewire(u, mapping)
        edit.add_control(u, [w2.id])
    return added, old_views


def _unread(g: Graph, views: Sequence[int]) -> list[int]:
    """The nodes among `views` (and views of them, latest first) whose outputs nothing reads
    and the step does not return."""
    outputs = set(g.outputs)
    pos = positions(g.order)
    waited_on = {p for deps in g.control.values() for p in deps}     # nodes others must follow
    dead: list[int] = []
    gone: set[int] = set()
    for v in sorted(set(views), key=lambda n: -pos[n]):
        out = g.nodes[v].outputs[0]
        if out is None or out in outputs or v in waited_on:
            continue
        if all(u in gone for u in g.users(out)):
            dead.append(v)
            gone.add(v)
    return dead
