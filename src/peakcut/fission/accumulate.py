"""Summed region outputs that a matrix product makes, accumulated by the product itself.

A region's summed output (a weight's gradient over the batch's rows, say) is rebuilt by
preallocating it with zeros and adding every part's value into it (peakcut.fission.merge).
Where a part's value is an aten.mm read by that add_ alone, the pair becomes one call that
adds the product into the output:

    p = mm(a_k, b_k); add_(t, p)        ->        addmm_(t, a_k, b_k)        # t += a_k @ b_k

Each part then makes no result of its own (one output-sized tensor less while it runs) and
runs no elementwise pass over t: on a GPU the GEMM reads t in its epilogue, where the user's
gradient accumulation (autograd's `grad += g` per micro-batch) runs one more kernel over every
gradient. The values are the same sums, rounded once per part in the product instead of once
in the product and once in the add (fission already sums the parts in its own order).

The pass runs on a finished expansion (peakcut.fission.expand), so expansion snapshots and
nested regions are unaffected: a nested region's own merges are fused where its parts make
them, and a merge of a nested region's result (made by zeros and adds, not by a product) stays.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace

from peakcut.fission.expanded import ExpandedRegion
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.ir.tags import FissionTag, NodeTags
from peakcut.transform.rewrite import positions, writers_of

MM = "aten.mm.default"
ADD_ = "aten.add_.Tensor"
ADDMM_ = "aten.addmm_.default"


def fusable(g: Graph, merge: int, sharing: Mapping[int, int], position: Mapping[int, int],
            waiting: Mapping[int, list[int]]) -> int | None:
    """The mm node that merge node `merge` can absorb (module doc), or None. sharing: per
    storage, how many tensors live in it; position: node -> index in the order; waiting:
    node -> the nodes with a control edge on it.

    The product then runs at the merge's place: so every node waiting on the mm must run
    after the merge, and nothing between the two may write the product's operands (a later
    region can have interleaved its own nodes there)."""
    node = g.nodes[merge]
    tag = node.tags.get(FissionTag)
    if tag is None or tag.role != "merge" or node.op != ADD_ or node.kwargs or len(node.args) != 2:
        return None
    acc, part = node.args
    if not isinstance(acc, TensorRef) or not isinstance(part, TensorRef):
        return None
    q = g.producer(part.id)
    if q is None:
        return None
    product = g.nodes[q]
    qtag = product.tags.get(FissionTag)
    if (product.op != MM or qtag is None or qtag.role != "part" or product.kwargs
            or product.output_ids() != [part.id] or g.users(part.id) != [merge]):
        return None
    p, t = g.tensors[part.id], g.tensors[acc.id]
    if (p.shape, p.dtype) != (t.shape, t.dtype) or sharing[p.storage] != 1:
        return None
    if any(position[u] < position[merge] for u in waiting.get(q, ())):
        return None
    operands = {g.tensors[x].storage for x in product.input_tuple}
    between = range(position[q] + 1, position[merge])
    if any(position[w] in between for ws in writers_of(g, operands).values() for w in ws):
        return None
    return q


def fusable_pairs(g: Graph, order: Sequence[int]) -> dict[int, int]:
    """Merge node -> the mm node it can absorb, for every merge of `order` fusable() allows."""
    merges = [nid for nid in order if g.nodes[nid].op == ADD_]
    if not merges:
        return {}
    sharing = Counter(t.storage for t in g.tensors.values())
    position = positions(order)
    waiting: dict[int, list[int]] = {}
    for u, deps in g.control.items():
        for d in deps:
            waiting.setdefault(d, []).append(u)
    pairs: dict[int, int] = {}
    for nid in merges:
        q = fusable(g, nid, sharing, position, waiting)
        if q is not None:
            pairs[nid] = q
    return pairs


def fuse_accumulations(edit: GraphEditor, order: Sequence[int],
                       regions: Sequence[ExpandedRegion]) -> tuple[list[int], tuple[ExpandedRegion, ...]]:
    """Fuse every merge fusable() allows, in edit's graph; the order and regions without the
    products absorbed. Each fused call keeps the merge's id, outputs and place in the order,
    and the product's name and fission tag (a part copy: Expanded.copies lists it)."""
    g = edit.graph
    pairs = fusable_pairs(g, order)
    if not pairs:
        return list(order), tuple(regions)
    absorbed = {q: m for m, q in pairs.items()}
    for m, q in pairs.items():
        merge, product = g.nodes[m], g.nodes[q]
        tag = product.tags.get(FissionTag)
        edit.replace_node(replace(product, id=m, op=ADDMM_, args=(merge.args[0], *product.args),
                                  outputs=merge.outputs, multi_output=merge.multi_output,
                                  tags=NodeTags(tag) if tag is not None else product.tags))
    for u, deps in list(g.control.items()):
        if any(d in absorbed for d in deps):
            edit.set_control(u, tuple(sorted({absorbed.get(d, d) for d in deps} - {u})))
    for m, q in pairs.items():
        inherited = set(g.control.get(q, ())) | set(g.control.get(m, ()))
        if inherited - set(g.control.get(m, ())):
            edit.set_control(m, tuple(sorted(inherited - {m})))
    edit.remove_nodes(list(absorbed))
    edit.remove_unused_storages()
    kept = [nid for nid in order if nid not in absorbed]
    edit.set_order(kept)
    return kept, tuple(replace(r, parts=tuple(tuple(x for x in part if x not in absorbed)
                                                  for part in r.parts)) for r in regions)
