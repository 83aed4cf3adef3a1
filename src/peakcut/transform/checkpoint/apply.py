"""Checkpointing blocks: each block's forward copied for its backward readers (package doc),
the originals nothing reads any more removed."""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.edit import GraphEditor, splice
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase
from peakcut.ir.tags import NodeTags, RematTag
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.transform.checkpoint.blocks import Block
from peakcut.transform.checkpoint.one_by_one import one_by_one
from peakcut.transform.checkpoint.plan import checked_plan
from peakcut.transform.remat import recompute_call
from peakcut.transform.rewrite import Rewrite, RuleError, StorageMove, alias_closure, apply_moves


def why_not_checkpoint(g: Graph, order: Sequence[int], block: Block) -> str | None:
    """Why `block` cannot be checkpointed in (g, order) (None when it can)."""
    plan = checked_plan(g, order, block)
    return plan if isinstance(plan, str) else None


def checkpoint_block(g: Graph, order: Sequence[int], block: Block) -> Rewrite:
    """`block` checkpointed (module doc); RuleError with why_not_checkpoint's reason where it
    cannot be."""
    plan = checked_plan(g, order, block)
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
                    phase=Phase.BACKWARD, name=f"{node.name or v}_ckpt", tags=NodeTags(RematTag(v, block.module)))
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
    return one_by_one(g, order, blocks, why_not_checkpoint, checkpoint_block,
                       f"checkpoint {{n}} blocks ({blocks[0].module} ... {blocks[-1].module})" if blocks else "")

