"""The inverse of checkpointing: which blocks a graph has checkpointed, and their backward
reading the forward's tensors again."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef, map_refs
from peakcut.ir.tags import RematTag
from peakcut.ir.tensor import TensorMeta
from peakcut.transform.checkpoint.blocks import list_name
from peakcut.transform.checkpoint.one_by_one import one_by_one
from peakcut.transform.remat import recompute_call
from peakcut.transform.rewrite import Rewrite, RuleError, check_order_matches


def checkpointed_blocks(g: Graph) -> dict[str, list[str]]:
    """The checkpointed blocks of g by list, named as find_blocks names them ('model.layers' ->
    ['model.layers.0', ...]), in order: the blocks whose recomputes (RematTag.block) are in g."""
    found: dict[str, None] = {}
    for nid in g.order:
        tag = g.nodes[nid].tags.get(RematTag)
        if tag is not None and tag.block:
            found[tag.block] = None
    lists: dict[str, list[str]] = {}
    for module in sorted(found, key=_natural):
        lists.setdefault(list_name(module), []).append(module)
    return lists


def _natural(module: str) -> tuple[tuple[str, int], ...]:
    """Sort key of a module path with its numbers compared as numbers (layer2.10 after layer2.9)."""
    return tuple((text, int(num) if num else -1) for text, num in re.findall(r"(\D*)(\d*)", module) if text or num)


def _copies(g: Graph, module: str) -> list[int]:
    return [v for v in g.order if (tag := g.nodes[v].tags.get(RematTag)) is not None and tag.block == module]


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
        tag = node.tags.get(RematTag)
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
            edit.replace_node(replace(node, tags=node.tags.without(RematTag)))
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
    return one_by_one(g, order, modules, why_not_uncheckpoint, uncheckpoint_block,
                       f"un-checkpoint {{n}} blocks ({modules[0]} ... {modules[-1]})" if modules else "")
