"""Parameter offload: a parameter lives in host memory between steps and comes to the device
once for each phase that uses it (forward and loss, backward, update), a fresh copy each time,
freed after that phase's last use.

    before                                   after
    w1 = detach(w)            (forward)      w_forward = peakcut.load(w)
    wt = t(w1); addmm(b, x, wt)              w1 = detach(w_forward); wt = t(w1); addmm(b, x, wt)
    t(wt)                     (backward)     w_backward = peakcut.load(w)
                                             w1' = detach(w_backward); wt' = t(w1'); t(wt')
    mul_(w, ..); addcdiv_(w, ..) (update)    w_update = peakcut.load(w); mul_(w_update, ..); ...
                                             peakcut.writeback(w, w_update)

A view of the parameter made in one phase and read in a later one is made again from that
phase's copy (views cost nothing). The host tensor is written only by the writeback, which
runs after the update's last write and after every load (control edges), so every copy holds
the values the original step read there: the numbers do not change.

Device memory then holds the parameter only from each load to its phase's last use instead of
the whole step; the host link carries it in once per phase and out once (the writeback). The
step binding keeps the parameter's tensor in (pinned) host memory between steps, as it does
for offloaded optimizer state (transform/offload_state.py, whose loads and writebacks these
are, with the same copy code: codegen/input_copy_code.py).

Sites (param_windows): the parameters still on the device that no phase copy would hold at a
step of the order (the memory peak), with the distance from it to the nearest phase's window;
the rule is peakcut.rules.offload_param_rule.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from peakcut.ir.edit import GraphEditor, rewired
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.ops import LOAD_OP, STORE_OP, WRITEBACK_OP
from peakcut.ir.registry import OpKind, lookup
from peakcut.ir.tags import HostTag
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.transform.host_input import why_not_host_input
from peakcut.transform.rewrite import (
    Rewrite,
    StorageMove,
    alias_closure,
    apply_moves,
    check_order_matches,
    describe_tensor,
    positions,
    spliced,
)

SEGMENTS: Mapping[Phase, str] = {Phase.FORWARD: "forward", Phase.LOSS: "forward",
                                 Phase.BACKWARD: "backward", Phase.OPTIMIZER: "update"}
"""The phase copy a node of each phase reads (the loss reads the forward's)."""
_RANK = {"forward": 0, "backward": 1, "update": 2}
_PHASE = {"forward": Phase.FORWARD, "backward": Phase.BACKWARD, "update": Phase.OPTIMIZER}


def _segment(g: Graph, nid: int) -> str:
    return SEGMENTS[g.nodes[nid].phase]


class _Uses:
    """Where a parameter's storage is used: its aliases (views and in-place results), the
    nodes touching it grouped by phase copy, and the producer of each alias."""

    def __init__(self, g: Graph, t: int) -> None:
        storage = g.tensors[t].storage
        # an update on the host of a parameter on the device reads it through a store and
        # writes it back through an upload (transform/host_update.py): kept in host memory,
        # the update reads and writes it there instead, and the two copies go
        self.host_copies = [n for n in dict.fromkeys((*g.users(t), *g.storage_writers(storage)))
                            if (tag := g.nodes[n].tags.get(HostTag)) is not None and tag.role in ("store", "upload")]
        own = set(self.host_copies)
        self.aliases = alias_closure(g, storage, [u for u in g.users(t) if u not in own])
        self.alias_set = frozenset(self.aliases)
        self.producer = {a: g.producer(a) for a in self.aliases}
        self.writers = [w for w in g.storage_writers(storage) if w not in own]
        touching = set(g.users(t)).union(*(g.users(a) for a in self.aliases), self.writers) - own
        self.by_segment: dict[str, list[int]] = {}
        for nid in touching:
            self.by_segment.setdefault(_segment(g, nid), []).append(nid)

    def window(self, pos: Mapping[int, int], segment: str) -> tuple[int, int]:
        spots = [pos[n] for n in self.by_segment[segment]]
        return min(spots), max(spots)

    def reads(self, g: Graph, nid: int, t: int) -> list[int]:
        """The parameter or aliases node `nid` reads."""
        return [x for x in g.nodes[nid].input_ids() if x == t or x in self.alias_set]


def offload_param_nodes(g: Graph) -> dict[int, Node]:
    """The loads and writebacks of parameters kept in host memory in g."""
    return g.input_copies(Role.PARAM)


def param_windows(g: Graph, order: Sequence[int], step: int) -> list[tuple[int, int, tuple[int, ...], int]]:
    """(parameter input, the first node touching it, its readers in order, steps between `step`
    and the nearest phase's window) for every parameter on the device whose phase windows
    do not hold `step` (why_not_offload_param has the full list of refusals)."""
    pos = positions(order)
    found = []
    for t in g.inputs:
        meta = g.tensors[t]
        if meta.role is not Role.PARAM or g.is_host_storage(meta.storage) or not g.users(t):
            continue
        uses = _Uses(g, t)
        gaps = []
        for segment in uses.by_segment:
            start, end = uses.window(pos, segment)
            gaps.append(0 if start <= step <= end else min(abs(step - start), abs(step - end)))
        gap = min(gaps)
        if gap > 0:
            first = min((n for ns in uses.by_segment.values() for n in ns), key=pos.__getitem__)
            found.append((t, first, tuple(sorted(g.users(t), key=pos.__getitem__)), gap))
    return found


def why_not_offload_param(g: Graph, order: Sequence[int], t: int) -> str | None:
    """Why parameter input `t` cannot be kept in host memory in (g, order); None when it can."""
    if t not in g.tensors or t not in g.inputs:
        return f"tensor {t} is not a program input"
    stale = check_order_matches(g, order)
    if stale:
        return stale
    meta = g.tensors[t]
    what = describe_tensor(g, t)
    input_name = g.input_names[g.inputs.index(t)]
    if meta.role is not Role.PARAM or not input_name.startswith("param:"):
        return f"{what} is not a parameter ({meta.role.value})"
    name = input_name.removeprefix("param:")
    if f"acc:{name}" in g.input_names:
        return (f"{what}: the step adds to its p.grad in place (accumulate=k), which lives where "
                "the parameter does")
    shared = why_not_host_input(g, t)
    if shared is not None:
        return shared
    uses = _Uses(g, t)
    if any(g.nodes[w].phase is not Phase.OPTIMIZER for w in uses.writers):
        return f"{what} is written in place outside the optimizer update"
    for a in uses.aliases:
        producer = uses.producer[a]
        if producer is None or a in g.outputs:
            return f"{describe_tensor(g, a)} is a view of it and a program output"
        reader_ranks = {_RANK[_segment(g, r)] for r in g.users(a)}
        made = _RANK[_segment(g, producer)]
        if reader_ranks and min(reader_ranks) < made:
            return f"{describe_tensor(g, a)} is read in a phase before the one that makes it"
        if reader_ranks - {made}:
            node = g.nodes[producer]
            info = lookup(node.op)
            if info is None or info.kind is not OpKind.VIEW or producer in uses.writers:
                return (f"{describe_tensor(g, a)} is read in a later phase than it is made, by "
                        f"{node.op}, which is not a view that can be made again")
            if len(node.output_ids()) != 1:
                return f"{describe_tensor(g, a)} is read in a later phase; {node.op} has several outputs"
    return None


def offload_params(g: Graph, order: Sequence[int], tensors: Sequence[int], description: str) -> Rewrite:
    """Parameters `tensors` (each checked by why_not_offload_param on g) kept in host memory,
    in one edit."""
    pos = positions(order)
    edit = GraphEditor(g)
    before: dict[int, list[int]] = {}       # a phase copy's node -> the nodes it goes before
    after: dict[int, list[int]] = {}        # writeback -> the writes and loads it follows
    added: list[int] = []
    changed: list[int] = []
    removed: list[int] = []
    for t in tensors:
        meta = g.tensors[t]
        uses = _Uses(g, t)
        label = meta.name or str(t)
        loads: list[int] = []
        for segment in sorted(uses.by_segment, key=_RANK.__getitem__):
            nodes = uses.by_segment[segment]
            copy_nodes = _copy_for_segment(edit, g, t, uses, segment, sorted(nodes, key=pos.__getitem__),
                                           f"{label}_{segment}")
            loads.append(copy_nodes[0])
            for nid in copy_nodes:
                before[nid] = nodes
            added.extend(copy_nodes)
        if uses.host_copies:
            _update_on_host_reads_it_there(edit, g, t, uses.host_copies, loads)
            removed.extend(uses.host_copies)
        elif uses.writers:
            back = Node(id=edit.new_id(), op=WRITEBACK_OP, args=(TensorRef(t), TensorRef(_update_copy(edit, loads))),
                        kwargs={}, outputs=(None,), phase=Phase.OPTIMIZER, name=f"writeback_{label}")
            edit.add_node(back)
            edit.set_control(back.id, [*uses.writers, *loads])
            after[back.id] = list(uses.writers)
            added.append(back.id)
        changed.extend(n for ns in uses.by_segment.values() for n in ns)
    edit.set_order(spliced(edit.graph.order, removed, after, before))
    return Rewrite(graph=edit.finish(), order=spliced(order, removed, after, before), added=tuple(added),
                   changed=tuple(sorted(set(changed), key=pos.__getitem__)), removed=tuple(removed),
                   description=description)


def _update_on_host_reads_it_there(edit: GraphEditor, g: Graph, t: int, copies: Sequence[int],
                                   loads: Sequence[int]) -> None:
    """Parameter t, updated on the host through a store and an upload (`copies`), is kept in
    host memory: the update's ops read and write t itself (the store's copy and what they
    made in it move into t's storage), after every load of t; the store and upload go."""
    store = next(n for n in copies if g.nodes[n].op == STORE_OP)
    (copy,) = g.nodes[store].output_tuple
    storage = g.tensors[copy].storage
    made = alias_closure(g, storage, g.users(copy))
    apply_moves(edit, [StorageMove(storage, g.tensors[t].storage, 0, tuple(m for m in made if m != copy))])
    gone = set(copies)
    for u in g.users(copy):
        if u not in gone:
            edit.rewire(u, {copy: t})
    edit.remove_nodes(copies)
    for nid, deps in list(edit.graph.control.items()):
        if gone.intersection(deps):
            edit.set_control(nid, [d for d in deps if d not in gone])
    for w in g.storage_writers(storage):
        if w not in gone:
            edit.set_control(w, dict.fromkeys([*edit.graph.control.get(w, ()), *loads]))


def _copy_for_segment(edit: GraphEditor, g: Graph, t: int, uses: _Uses, segment: str,
                      nodes: Sequence[int], label: str) -> list[int]:
    """Add the load of `segment` and the views it must make again; rewire the segment's
    nodes to read them. Returns the added nodes in a valid order, the load first."""
    meta = g.tensors[t]
    storage = edit.add_storage(meta.nbytes)
    copy = TensorMeta(edit.new_id(), meta.shape, meta.stride, meta.dtype, storage, 0, Role.ACTIVATION, label)
    load = Node(id=edit.new_id(), op=LOAD_OP, args=(TensorRef(t),), kwargs={"device": torch.device(g.device)},
                outputs=(copy.id,), phase=_PHASE[segment], name=f"load_{label}")
    edit.add_node(load, [copy])
    made_here = tuple(a for a in uses.aliases if _segment(g, uses.producer[a]) == segment)  # type: ignore[arg-type]
    apply_moves(edit, [StorageMove(meta.storage, storage, 0, made_here)])
    version: dict[int, int] = {t: copy.id, **{a: a for a in made_here}}
    added = [load.id]

    def resolve(a: int) -> int:
        if a in version:
            return version[a]
        producer = g.nodes[uses.producer[a]]  # type: ignore[index]
        mapping = {x: resolve(x) for x in uses.reads(g, producer.id, t)}
        old = g.tensors[a]
        again = TensorMeta(edit.new_id(), old.shape, old.stride, old.dtype, storage, old.storage_offset,
                           Role.ACTIVATION, f"{old.name or a}_{segment}")
        node = dataclasses.replace(rewired(producer, mapping), id=edit.new_id(), outputs=(again.id,),
                                   phase=_PHASE[segment], name=f"{producer.name or producer.op}_{segment}")
        edit.add_node(node, [again])
        added.append(node.id)
        version[a] = again.id
        return again.id

    for nid in nodes:
        mapping = {x: resolve(x) for x in uses.reads(g, nid, t)}
        edit.rewire(nid, mapping)
    return added


def _update_copy(edit: GraphEditor, loads: Sequence[int]) -> int:
    """The device copy the update writes: the last phase's load's output."""
    return edit.graph.nodes[loads[-1]].output_ids()[0]


def remade_views(g: Graph, mine: Mapping[int, Node]) -> list[int]:
    """The views read off the parameter copies (moved late, next to their readers)."""
    found: list[int] = []
    frontier = [t for nid, n in mine.items() if n.op == LOAD_OP for t in n.output_ids()]
    seen: set[int] = set()
    while frontier:
        tensor = frontier.pop()
        for user in g.users(tensor):
            node = g.nodes[user]
            info = lookup(node.op)
            if user in seen or info is None or info.kind is not OpKind.VIEW or node.op in (LOAD_OP, WRITEBACK_OP):
                continue
            seen.add(user)
            found.append(user)
            frontier.extend(node.output_ids())
    return found
