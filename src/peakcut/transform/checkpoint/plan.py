"""What checkpointing a block copies and where (package doc): the forward nodes whose
tensors a backward node reads, their ancestors in the block, the backward readers to
rewire, the place of the copies in the order, and the in-place writers that must wait for
them; or why the block cannot be checkpointed (package doc: Safety)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.registry import OpKind, draws_random, lookup
from peakcut.transform.checkpoint.blocks import Block
from peakcut.transform.remat import recompute_call, why_not_recompute_op
from peakcut.transform.rewrite import (
    alias_closure,
    check_order_matches,
    describe_node,
    describe_tensor,
    positions,
    program_output_storages,
    why_not_move,
)


@dataclass(frozen=True)
class CopyPlan:
    """Where and what a checkpoint of one block copies."""

    copied: tuple[int, ...]          # the forward nodes to copy, in capture order
    readers: tuple[int, ...]         # backward nodes to rewire to the copies
    position: int                    # where the copies go in `order`
    capture_position: int            # and in g.order
    hazards: dict[int, tuple[int, ...]]   # in-place writer -> the copies it must follow
    order: tuple[int, ...]           # `order` with early views and writers moved (_sink_views, _sink_writers)


def _moved(order: Sequence[int], before: dict[int | None, list[int]]) -> list[int]:
    """`order` with each node of before[anchor] taken out and put back just before `anchor`
    (None: at the end), in the lists' order."""
    moving = {v for vs in before.values() for v in vs}
    out: list[int] = []
    for v in order:
        if v not in moving:
            out += before.get(v, [])
            out.append(v)
    return out + before.get(None, [])


def _sink_views(g: Graph, order: Sequence[int], pos: dict[int, int], readers: dict[int, None],
                last: int) -> dict[int | None, list[int]]:
    """The backward readers that are views and run at or before position `last`, each under the
    node it should run just before: its first user. A view of a saved tensor (a transpose a
    backward matmul reads) costs nothing, so a memory-aware order may run it anywhere after its
    input: optimize's re-order put Swin's attention transposes inside the forward, and no block
    could be checkpointed. Moving a view later keeps the order topological (its users come
    after it) and frees nothing later (its storage is its input's)."""
    waits = {p for preds in g.control.values() for p in preds}
    early = [u for u in readers if pos[u] <= last and (info := lookup(g.nodes[u].op)) is not None
             and info.kind is OpKind.VIEW and not g.mutated_tensors(u) and u not in g.control and u not in waits]
    first_user: dict[int, int | None] = {}
    for u in early:
        users = [w for t in g.nodes[u].output_ids() for w in g.users(t)]
        first_user[u] = min(users, key=pos.__getitem__) if users else None
    before: dict[int | None, list[int]] = {}
    for u in sorted(early, key=pos.__getitem__):
        target = first_user[u]
        while target in first_user:          # a view of a moved view goes where that one goes
            target = first_user[target]
        before.setdefault(target, []).append(u)
    return before


def _plan(g: Graph, order: Sequence[int], block: Block) -> CopyPlan | str:
    inside = set(block.nodes)
    made = {t: v for v in block.nodes for t in g.nodes[v].output_ids()}
    readers, wanted = _backward_readers(g, block, inside, made)
    if not readers:
        return f"no backward node of {block.module} reads a tensor its forward makes (checkpointed already?)"
    ordered = _ancestors_inside(g, block, inside, wanted)
    reason = _why_not_copy(g, block, inside, ordered, made, readers)
    if reason:
        return reason
    pos = positions(order)
    views = _sink_views(g, order, pos, readers, max(pos[v] for v in ordered))
    if views:
        order = _moved(order, views)
        pos = positions(order)
    sunk = _sink_writers(g, order, pos, ordered, min(pos[u] for u in readers), made)
    if sunk:
        order = _moved(order, {order[min(pos[u] for u in readers)]: sunk})
        pos = positions(order)
    position = min(pos[u] for u in (*readers, *sunk))
    capture = positions(g.order)
    capture_position = min(capture[u] for u in readers)
    if max(pos[v] for v in ordered) >= position:
        return f"{describe_node(g, min(readers, key=pos.__getitem__))} runs before the forward of {block.module} ends"
    hazards = _hazards(g, block, inside, ordered, made, pos, capture, (position, capture_position))
    if isinstance(hazards, str):
        return hazards
    return CopyPlan(ordered, tuple(sorted(readers, key=pos.__getitem__)), position, capture_position, hazards,
                 tuple(order))


def _backward_readers(g: Graph, block: Block, inside: set[int], made: dict[int, int]
                      ) -> tuple[dict[int, None], list[int]]:
    """The backward nodes reading a tensor the block's forward makes (those to rewire), and the
    block nodes that make those tensors. Tensors in a storage the block hands to later forward
    (or loss) nodes are the block's output: kept, not recomputed. Views of a storage the block
    does not allocate (a weight's transpose, which a backward matmul transposes back) free
    nothing: their readers keep them. A block that recomputes what it hands on
    (Block.recompute_handed: an attention's scores) keeps none. (A memory-aware order may run such a backward view
    before the block's forward ends: Swin's fc2 weight, after optimize's re-order.)"""
    tensors = g.tensors
    handed = set() if block.recompute_handed else {
        tensors[t].storage for t in made for u in g.users(t) if u not in inside and g.nodes[u].phase is not Phase.BACKWARD}
    readers: dict[int, None] = {}
    wanted: list[int] = []
    for t in made:
        if tensors[t].storage in handed or g.storage_owner_of(tensors[t].storage) not in inside:
            continue
        late = [u for u in g.users(t) if g.nodes[u].phase is Phase.BACKWARD]
        if late:
            wanted.append(made[t])
            readers.update(dict.fromkeys(late))
    return readers, wanted


def _ancestors_inside(g: Graph, block: Block, inside: set[int], wanted: list[int]) -> tuple[int, ...]:
    """`wanted` and their ancestors within the block, in the block's order: what is copied."""
    copied: set[int] = set()
    stack = list(dict.fromkeys(wanted))
    producer = g.producer_map()
    while stack:
        v = stack.pop()
        if v in copied:
            continue
        copied.add(v)
        stack.extend(p for t in g.nodes[v].input_tuple if (p := producer.get(t)) in inside and p not in copied)
    return tuple(v for v in block.nodes if v in copied)


def _why_not_copy(g: Graph, block: Block, inside: set[int], ordered: tuple[int, ...],
                  made: dict[int, int], readers: dict[int, None]) -> str | None:
    """Why the nodes `ordered` cannot be recomputed for `readers` (module doc: Safety)."""
    randoms = [v for v in ordered if draws_random(g.nodes[v].op, g.nodes[v].args, g.nodes[v].kwargs)]
    if randoms:   # the cause to name first (dropout also makes an uninitialized mask)
        return (f"{describe_node(g, randoms[0])} draws random numbers: a recompute would not give "
                "the same result")
    outputs = program_output_storages(g)
    copied = set(ordered)
    copied_storages: set[int] = set()
    for v in ordered:
        reason = why_not_recompute_op(g, v, views=True)
        if reason:
            return reason
        for t in g.nodes[v].output_ids():
            s = g.tensors[t].storage
            owner = g.storage_owner_of(s)
            if owner is not None and owner in inside and owner not in copied:
                return f"{describe_tensor(g, t)} is a view of a tensor of {block.module} that is not recomputed"
            if s in outputs:
                return f"{describe_tensor(g, t)} is (or shares storage with) a program output"
            if owner == v:
                copied_storages.add(s)
    for s in copied_storages:
        reason = why_not_move(g, [v for v in alias_closure(g, s, readers) if v not in made], g.storages[s], 0)
        if reason:
            return reason
        writers = g.storage_writers(s)
        if writers:
            return (f"a storage made by {block.module} is written in place by "
                    f"{describe_node(g, writers[0])}: a recompute would miss that write")
    return None


def _external_storages(g: Graph, ordered: tuple[int, ...], made: dict[int, int]) -> dict[int, int]:
    """Storages the copies read from outside the block (a parameter), each with a tensor in it."""
    external: dict[int, int] = {}
    for v in ordered:
        for t in recompute_call(g.nodes[v]).input_tuple:
            if t not in made:
                external[g.tensors[t].storage] = t
    return external


def _sink_writers(g: Graph, order: Sequence[int], pos: dict[int, int], ordered: tuple[int, ...],
                  first_reader: int, made: dict[int, int]) -> list[int]:
    """The in-place writers of a storage the copies read (a parameter's weight decay, which
    reads no gradient, so a memory-aware order may run it right after the forward's last read)
    that run between the block's forward and its first backward reader (position
    `first_reader`), in order: to move to just before that reader, the copies before them, so
    that the copies read the value the forward read. Only where no other node between touches
    the storage or waits for a writer (the writers' relative order, and every read of the new
    value, stay as they were)."""
    first = min(pos[v] for v in ordered)
    moved: list[int] = []
    for s in _external_storages(g, ordered, made):
        writers = [m for m in g.storage_writers(s) if first <= pos[m] < first_reader]
        if not writers:
            continue
        span = order[min(pos[m] for m in writers) + 1:first_reader]
        others = [u for u in span if u not in writers and (
            any(g.tensors[t].storage == s for t in g.nodes[u].input_tuple)
            or any(g.tensors[t].storage == s for t in g.nodes[u].output_ids())
            or any(m in g.control.get(u, ()) for m in writers))]
        if not others:
            moved += writers
    return sorted(set(moved), key=pos.__getitem__)


def _hazards(g: Graph, block: Block, inside: set[int], ordered: tuple[int, ...], made: dict[int, int],
             pos: dict[int, int], capture: dict[int, int], at: tuple[int, int]
             ) -> dict[int, tuple[int, ...]] | str:
    """In-place writers of storages the copies read from outside the block (a parameter's
    update), each with the copies that must run before it; a reason where such a write falls
    between the block's forward and the copies' place `at` (in the order, in capture order)."""
    tensors = g.tensors
    external = _external_storages(g, ordered, made)
    readers: dict[int, list[int]] = {}         # storage -> the copied nodes reading it (views included)
    for v in ordered:
        for t in recompute_call(g.nodes[v]).input_tuple:
            readers.setdefault(tensors[t].storage, []).append(v)
    first = min(pos[v] for v in ordered)
    hazards: dict[int, list[int]] = {}
    for s, t in external.items():
        for m in g.storage_writers(s):
            if m in inside or pos[m] < first:
                continue      # a write before the block's forward: the forward and the copy see it alike
            if pos[m] < at[0] or capture[m] < at[1]:
                return (f"{describe_node(g, m)} writes {describe_tensor(g, t)} in place between the "
                        f"forward of {block.module} and its backward")
            hazards.setdefault(m, []).extend(readers[s])
    return {m: tuple(dict.fromkeys(vs)) for m, vs in hazards.items()}


def checked_plan(g: Graph, order: Sequence[int], block: Block) -> CopyPlan | str:
    """What checkpointing `block` in (g, order) copies and where, or why it cannot be done."""
    stale = check_order_matches(g, order)
    if stale:
        return stale
    missing = [v for v in block.nodes if v not in g.nodes]
    if missing:
        return f"node {missing[0]} of {block.module} is not in the graph"
    return _plan(g, order, block)

