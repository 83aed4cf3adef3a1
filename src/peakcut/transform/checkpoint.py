"""Activation checkpointing of repeated blocks (a transformer's layers) as a rewrite of the step.

A block is the forward nodes of one repeated module (`model.layers.3`, `transformer.h.10`,
ResNet's bottleneck `layer2.1`, U-Net++'s `nodes.x1_0`: find_blocks). Checkpointing a block
gives its backward a recomputed copy of the block's forward: every backward node that read a
tensor the block's forward made reads the copy's tensor instead. The copies read the
block's inputs (the residual stream, parameters, masks, the rotary tables), are placed
together right before the first backward node that reads one of them, and carry a RematTag
naming the original (the generated code comments them as recomputes). The forward's own
tensors are then freed when the forward is done with them, as with
`torch.utils.checkpoint` around each block. Tensors a block hands to later forward nodes
(its output: the next block's input) are not recomputed: they are what is kept. Forward
nodes nothing reads any more (the detach of a tensor saved for the backward) are removed.

Unlike the remat program rule, this is a rewrite of the base graph (peakcut.rules
CheckpointBlocksRule): the copies become base nodes, so a fission region that spans the
blocks (micro-batching the whole step) splits them with the rest, and each part recomputes
its own rows.

Safety (DESIGN invariants 2 and 4), checked per block; a block that fails is left alone:
- every copied node is an op the registry knows, draws no random numbers, writes nothing in
  place and returns initialized memory; a training-mode batch norm is copied without its
  running statistics (remat.recompute_call): it gives the same outputs, and the statistics
  are updated once, by the forward, as in eager;
- no copied tensor is a program output or written in place by any node;
- every in-place writer of a storage the copies read (an optimizer update of a parameter)
  runs after the copies' place in the order and gets a control edge "after the copy".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from peakcut.ir.edit import GraphEditor, splice
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase, TensorRef, map_refs
from peakcut.ir.registry import OpKind, draws_random, lookup
from peakcut.ir.tags import NodeTags, RematTag
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.transform.remat import recompute_call, why_not_recompute_op
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    StorageMove,
    alias_closure,
    apply_moves,
    check_order_matches,
    compose_rewrites,
    describe_node,
    describe_tensor,
    positions,
    program_output_storages,
    why_not_move,
)

_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Block:
    """One repeated module's forward nodes, in capture order."""

    module: str                # e.g. "model.layers.3", "layer2.1", "nodes.x1_0"
    nodes: tuple[int, ...]


def find_blocks(g: Graph) -> dict[str, list[Block]]:
    """The step's repeated blocks, by list name ('model.layers' -> its blocks in order).

    A block is a module whose forward runs ops of at least two module paths (a layer, not a
    single convolution), one of at least two such modules whose paths differ only in their
    numbers: `model.layers.3`, ResNet's bottlenecks `layer2.1` (across stages), U-Net++'s
    `nodes.x1_0`. Where such families nest (a stage `layer2` holds bottlenecks; a layer holds
    its `mlp`), the family with more members wins, the outer one on a tie. A list is named
    by its pattern without a trailing number (`model.layers`, `layer#`, `nodes.x#_#`).
    """
    under: dict[str, list[int]] = {}       # module path -> the forward nodes under it
    paths: dict[str, set[str]] = {}         # module path -> the module paths of those nodes
    for nid in g.order:
        node = g.nodes[nid]
        if node.phase is not Phase.FORWARD or node.tags.remat is not None or not node.module:
            continue
        parts = node.module.split(".")
        for k in range(1, len(parts) + 1):
            prefix = ".".join(parts[:k])
            under.setdefault(prefix, []).append(nid)
            paths.setdefault(prefix, set()).add(node.module)
    families: dict[str, list[str]] = {}
    for prefix in under:                   # in the order of their first forward node
        if len(paths[prefix]) >= 2 and _NUMBER.search(prefix):
            families.setdefault(_NUMBER.sub("#", prefix), []).append(prefix)
    chosen: list[str] = []
    for pattern in sorted((p for p, ms in families.items() if len(ms) >= 2),
                          key=lambda p: (-len(families[p]), p.count("."))):
        if not any(pattern.startswith(c + ".") or c.startswith(pattern + ".") for c in chosen):
            chosen.append(pattern)
    return {p.removesuffix(".#"): [Block(m, tuple(under[m])) for m in families[p]]
            for p in sorted(chosen, key=lambda p: min(under[m][0] for m in families[p]))}


def blocks_of(g: Graph, nodes: Sequence[int]) -> list[Block] | str:
    """`nodes` (forward nodes of blocks find_blocks finds) grouped by block, in order; a reason
    where one is not such a node in g."""
    module = {v: b.module for blocks in find_blocks(g).values() for b in blocks for v in b.nodes}
    grouped: dict[str, list[int]] = {}
    for v in nodes:
        if v not in module:
            return f"node {v} is not a forward node of a repeated block in this graph"
        grouped.setdefault(module[v], []).append(v)
    return [Block(key, tuple(vs)) for key, vs in grouped.items()]


@dataclass(frozen=True)
class _Plan:
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


def _plan(g: Graph, order: Sequence[int], block: Block) -> _Plan | str:
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
    return _Plan(ordered, tuple(sorted(readers, key=pos.__getitem__)), position, capture_position, hazards,
                 tuple(order))


def _backward_readers(g: Graph, block: Block, inside: set[int], made: dict[int, int]
                      ) -> tuple[dict[int, None], list[int]]:
    """The backward nodes reading a tensor the block's forward makes (those to rewire), and the
    block nodes that make those tensors. Tensors in a storage the block hands to later forward
    (or loss) nodes are the block's output: kept, not recomputed. Views of a storage the block
    does not allocate (a weight's transpose, which a backward matmul transposes back) free
    nothing: their readers keep them. (A memory-aware order may run such a backward view
    before the block's forward ends: Swin's fc2 weight, after optimize's re-order.)"""
    tensors = g.tensors
    handed = {tensors[t].storage for t in made
              for u in g.users(t) if u not in inside and g.nodes[u].phase is not Phase.BACKWARD}
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


def _checked_plan(g: Graph, order: Sequence[int], block: Block) -> _Plan | str:
    stale = check_order_matches(g, order)
    if stale:
        return stale
    missing = [v for v in block.nodes if v not in g.nodes]
    if missing:
        return f"node {missing[0]} of {block.module} is not in the graph"
    return _plan(g, order, block)


def why_not_checkpoint(g: Graph, order: Sequence[int], block: Block) -> str | None:
    """Why `block` cannot be checkpointed in (g, order) (None when it can)."""
    plan = _checked_plan(g, order, block)
    return plan if isinstance(plan, str) else None


def checkpoint_block(g: Graph, order: Sequence[int], block: Block) -> Rewrite:
    """`block` checkpointed (module doc); RuleError with why_not_checkpoint's reason where it
    cannot be."""
    plan = _checked_plan(g, order, block)
    if isinstance(plan, str):
        raise RuleError(plan)
    edit = GraphEditor(g)
    tensor_map: dict[int, int] = {}
    storage_map: dict[int, int] = {}
    node_map: dict[int, int] = {}
    copies: list[int] = []
    for v in plan.copied:
        node = recompute_call(g.nodes[v])
        metas: list[TensorMeta] = []
        outs: list[int | None] = []
        for t in node.outputs:
            if t is None:
                outs.append(None)
                continue
            meta = g.tensors[t]
            s = meta.storage
            if g.storage_owner_of(s) == v and s not in storage_map:
                storage_map[s] = edit.add_storage(g.storages[s])
            t2 = edit.new_id()
            metas.append(TensorMeta(t2, meta.shape, meta.stride, meta.dtype, storage_map.get(s, s),
                                    meta.storage_offset, Role.ACTIVATION, f"{meta.name or t}_ckpt"))
            tensor_map[t] = t2
            outs.append(t2)
        copy = Node(id=edit.new_id(), op=node.op, args=node.args, kwargs=dict(node.kwargs),
                    outputs=tuple(outs), multi_output=node.multi_output, module=node.module,
                    phase=Phase.BACKWARD, name=f"{node.name or v}_ckpt", tags=NodeTags(remat=RematTag(v, block.module)))
        edit.add_node(copy, metas)
        edit.rewire(copy.id, tensor_map)
        node_map[v] = copy.id
        copies.append(copy.id)
        if v in g.control:
            edit.set_control(copy.id, tuple(node_map.get(c, c) for c in g.control[v]))
    moves = [StorageMove(s, s2, 0, tuple(v for v in alias_closure(g, s, plan.readers) if v not in tensor_map))
             for s, s2 in storage_map.items()]
    for u in plan.readers:
        edit.rewire(u, tensor_map)
    apply_moves(edit, moves)   # views the readers make of a copied tensor live in the copy's storage
    for m, vs in plan.hazards.items():
        edit.add_control(m, [node_map[v] for v in vs])
    edit.insert_in_order(plan.capture_position, copies)
    removed = _remove_dead(edit, plan.copied)
    gone = set(removed)
    return Rewrite(
        graph=edit.finish(), order=[v for v in splice(plan.order, plan.position, copies) if v not in gone],
        added=tuple(copies), changed=tuple(dict.fromkeys((*plan.readers, *plan.hazards))), removed=removed,
        description=f"checkpoint {block.module}: {len(copies)} forward ops recomputed for "
                    f"{len(plan.readers)} backward reader(s)",
    )


def _remove_dead(edit: GraphEditor, originals: Sequence[int]) -> tuple[int, ...]:
    """Remove the originals no node reads any more (the forward's detach of a tensor saved for
    the backward: its readers now read the copy's), last first so that chains of them go; a
    dead tensor kept would hold its storage to the end of a fission region. Returns them."""
    g = edit.graph
    ordered_after = {p for preds in g.control.values() for p in preds}
    removed: list[int] = []
    storages: set[int] = set()
    for v in reversed(originals):
        node = g.nodes[v]
        outs = node.output_ids()
        if v in ordered_after or any(g.users(t) or t in g.outputs for t in outs):
            continue
        storages.update(g.tensors[t].storage for t in outs)
        edit.remove_node(v)
        removed.append(v)
    edit.remove_unused_storages(storages)
    return tuple(removed)


def checkpoint_blocks(g: Graph, order: Sequence[int], blocks: Sequence[Block]) -> tuple[Rewrite | None, list[str | None]]:
    """Every block of `blocks` that can be checkpointed, one after another: the rewrite (None
    when none can) and, per block, why it was not (None: it was)."""
    return _one_by_one(g, order, blocks, why_not_checkpoint, checkpoint_block,
                       f"checkpoint {{n}} blocks ({blocks[0].module} ... {blocks[-1].module})" if blocks else "")


T = TypeVar("T")


def _one_by_one(g: Graph, order: Sequence[int], items: Sequence[T],
                why_not: Callable[[Graph, Sequence[int], T], str | None],
                apply: Callable[[Graph, Sequence[int], T], Rewrite], plural: str
                ) -> tuple[Rewrite | None, list[str | None]]:
    """`apply` at each item where `why_not` says None, each judged on the graph the ones before
    made: the rewrites as one (described by the one's own words, or `plural` with {n} the
    count; None when none applied) and, per item, why not (None: applied)."""
    reasons: list[str | None] = []
    steps: list[Rewrite] = []
    for item in items:
        h, o = (g, order) if not steps else (steps[-1].graph, steps[-1].order)
        reason = why_not(h, o, item)
        reasons.append(reason)
        if reason is None:
            steps.append(apply(h, o, item))
    if not steps:
        return None, reasons
    what = steps[0].description if len(steps) == 1 else plural.format(n=len(steps))
    return compose_rewrites(g, steps, what), reasons


# ------------------------------------------------------------------ the inverse
def checkpointed_blocks(g: Graph) -> dict[str, list[str]]:
    """The checkpointed blocks of g by list, named as find_blocks names them ('model.layers' ->
    ['model.layers.0', ...]), in order: the blocks whose recomputes (RematTag.block) are in g."""
    found: dict[str, None] = {}
    for nid in g.order:
        tag = g.nodes[nid].tags.remat
        if tag is not None and tag.block:
            found[tag.block] = None
    lists: dict[str, list[str]] = {}
    for module in sorted(found, key=_natural):
        lists.setdefault(_NUMBER.sub("#", module).removesuffix(".#"), []).append(module)
    return lists


def _natural(module: str) -> tuple[tuple[str, int], ...]:
    """Sort key of a module path with its numbers compared as numbers (layer2.10 after layer2.9)."""
    return tuple((text, int(num) if num else -1) for text, num in re.findall(r"(\D*)(\d*)", module) if text or num)


def _copies(g: Graph, module: str) -> list[int]:
    return [v for v in g.order if (tag := g.nodes[v].tags.remat) is not None and tag.block == module]


def why_not_uncheckpoint(g: Graph, order: Sequence[int], module: str) -> str | None:
    """Why the checkpoint of block `module` cannot be undone (None when it can)."""
    stale = check_order_matches(g, order)
    if stale:
        return stale
    if not _copies(g, module):
        return f"{module} is not checkpointed in this graph"
    return None


def uncheckpoint_block(g: Graph, order: Sequence[int], module: str) -> Rewrite:
    """The backward of block `module` reads the forward's tensors again: each recompute whose
    original is still in g (and computes the same) is dropped and its readers read the
    original; a recompute whose original was removed (nothing else read it) stays, reading
    the originals, its views re-homed to the originals' storages. RuleError where
    why_not_uncheckpoint says no."""
    reason = why_not_uncheckpoint(g, order, module)
    if reason:
        raise RuleError(reason)
    copies = _copies(g, module)
    back: dict[int, int] = {}          # a dropped recompute's output -> the original's
    dropped: list[int] = []
    for c in copies:
        node = g.nodes[c]
        tag = node.tags.remat
        original = g.nodes.get(tag.of) if tag is not None else None
        if original is None or not _same_call(node, original, back):
            continue
        back.update({t2: t for t2, t in zip(node.outputs, original.outputs, strict=True)
                     if t2 is not None and t is not None})
        dropped.append(c)
    storages = {g.tensors[t2].storage: g.tensors[t].storage for t2, t in back.items()
                if g.storage_owner_of(g.tensors[t2].storage) in dropped}
    gone = set(dropped)
    edit = GraphEditor(g)
    readers = sorted({u for t in back for u in g.users(t) if u not in gone})
    for u in readers:
        edit.rewire(u, back)
    for c in copies:    # the kept ones: plain backward nodes from now on
        if c not in gone:
            node = edit.graph.nodes[c]
            edit.replace_node(replace(node, tags=node.tags._replace(remat=None)))
    for t, meta in g.tensors.items():   # views of a dropped recompute's tensors live in the original's storage
        if meta.storage in storages and t not in back:
            edit.set_tensor(TensorMeta(t, meta.shape, meta.stride, meta.dtype, storages[meta.storage],
                                       meta.storage_offset, meta.role, meta.name))
    guarded = [m for m, preds in g.control.items() if m not in gone and gone.intersection(preds)]
    for m in guarded:
        edit.set_control(m, (p for p in g.control[m] if p not in gone))
    edit.remove_nodes(dropped, keep_tensors=())
    edit.remove_unused_storages(storages)
    return Rewrite(
        graph=edit.finish(), order=[v for v in order if v not in gone], added=(),
        changed=tuple(dict.fromkeys((*readers, *guarded))), removed=tuple(dropped),
        description=f"un-checkpoint {module}: its backward reads the forward's {len(dropped)} tensors again",
    )


def _same_call(copy: Node, original: Node, back: dict[int, int]) -> bool:
    """Whether `copy`, its tensor arguments read back through `back`, is `original`'s recompute
    (remat.recompute_call: a batch norm's copy passes no running statistics)."""
    def read_back(ref: TensorRef) -> TensorRef:
        return TensorRef(back.get(ref.id, ref.id))

    call = recompute_call(original)
    return (copy.op == call.op and len(copy.outputs) == len(call.outputs)
            and map_refs(copy.args, read_back) == call.args
            and map_refs(copy.kwargs, read_back) == call.kwargs)


def uncheckpoint_blocks(g: Graph, order: Sequence[int], modules: Sequence[str]
                        ) -> tuple[Rewrite | None, list[str | None]]:
    """uncheckpoint_block for each of `modules` that can be: the rewrite (None when none can)
    and, per module, why not (None: done)."""
    return _one_by_one(g, order, modules, why_not_uncheckpoint, uncheckpoint_block,
                       f"un-checkpoint {{n}} blocks ({modules[0]} ... {modules[-1]})" if modules else "")
