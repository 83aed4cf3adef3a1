"""split_rows: a spatial region rewritten as its parts, one after another (package doc).

The steps: the tensors the region hands on allocated whole (the same ids); per loss, the
tensor its parts' counts add into; part k of each node, in the region's order; a mean loss
divided after the last part; the originals removed and the parts ordered and guarded."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.tensor import contiguous_strides
from peakcut.transform.rewrite import Rewrite, RuleError, describe_node
from peakcut.transform.spatial.halos import needs
from peakcut.transform.spatial.op_parts import (
    conv_backward_part,
    nll_forward_part,
    row_op_part,
    tiles,
)
from peakcut.transform.spatial.ops import (
    CONV_BACKWARD,
    NLL_FORWARD,
    REDUCTION_MEAN,
    Rows,
    reads_grad_input_inside,
)
from peakcut.transform.spatial.parts import Parts
from peakcut.transform.spatial.region import Region, downstream, find_region


def split_rows(g: Graph, order: Sequence[int], nodes: Sequence[int], n: int) -> Rewrite:
    """Run the region `nodes` in `n` parts along its images' rows (package doc). Raises
    RuleError (why_not_split_rows's reason) when it does not apply."""
    region = find_region(g, order, nodes, n)
    if isinstance(region, str):
        raise RuleError(region)
    b = Parts(g, region, n)
    first = g.nodes[region.nodes[0]]
    tiled = {t for v in region.nodes if g.nodes[v].op == CONV_BACKWARD and tiles(g, g.nodes[v], n)
             for t in g.nodes[v].outputs[:1] if t is not None}
    allocs = _whole_tensors(b, region, tiled)
    totals = _loss_totals(b, region, allocs)
    writes: list[int] = []
    for k in range(n):
        writes += _part(b, region, k, tiled, totals)
    _divide_means(b, region, totals, writes)
    return _finish(g, order, region, b, allocs, writes, first)


def _whole_tensors(b: Parts, region: Region, tiled: set[int]) -> list[int]:
    """Allocate each tensor the region hands on whole, before the parts (the same tensor ids,
    so its readers are untouched): zeroed where the parts add into it and do not tile it.
    Returns the new nodes."""
    g = b.g
    made_by = {t: g.nodes[v] for v in region.nodes for t in g.nodes[v].output_ids()}
    allocs = []
    for t in (*region.rows, *region.added):
        meta, producer = g.tensors[t], made_by[t]
        opts = {"dtype": meta.torch_dtype, "device": torch.device(g.device)}
        dense = meta.stride == contiguous_strides(meta.shape)
        zeroed = t in region.added and t not in tiled
        op, args = (("aten.zeros.default", (list(meta.shape),)) if zeroed and dense
                    else ("aten.empty_strided.default", (list(meta.shape), list(meta.stride))))
        allocs.append(b.edit.add_op(op, args, opts, name=f"{meta.name or t}_alloc", phase=producer.phase,
                                    module=producer.module, outputs=[t]).id)
        if zeroed and not dense:      # a channels-last gradient: zeroed in its own layout
            allocs.append(b.edit.add_op("aten.zero_.default", (TensorRef(t),), {}, name=f"{meta.name or t}_zero",
                                        phase=producer.phase, module=producer.module).id)
    return allocs


def _loss_totals(b: Parts, region: Region, allocs: list[int]) -> dict[int, int]:
    """Per loss in the region, the tensor its parts' total weights add into: the loss's own
    total weight where it is handed on, else a zeroed scalar allocated here (its node added to
    `allocs`)."""
    g = b.g
    totals = {}
    for v in region.nodes:
        node = g.nodes[v]
        if node.op == NLL_FORWARD:
            tw = node.outputs[1]
            if tw is not None and tw in region.added:
                totals[v] = tw
            else:
                dtype = g.tensors[node.output_ids()[-1]].torch_dtype   # the loss's and its total's
                scratch = b.edit.add_op("aten.zeros.default", ([],), {"dtype": dtype,
                                        "device": torch.device(g.device)}, name=f"{node.name or v}_total_weight",
                                        phase=node.phase, module=node.module)
                allocs.append(scratch.id)
                totals[v] = scratch.output_ids()[0]
    return totals


def _part(b: Parts, region: Region, k: int, tiled: set[int], totals: dict[int, int]) -> list[int]:
    """Part k of every node of the region, in its order: the writes into handed-on tensors."""
    g, n = b.g, b.n
    need = needs(g, region.nodes, region.rows, k, n)
    part: dict[int, tuple[int, Rows]] = {}
    b.slices.clear()
    writes: list[int] = []
    for v in region.nodes:
        node = g.nodes[v]
        if node.op == CONV_BACKWARD:
            writes += conv_backward_part(b, node, k, n, part, node.outputs[0] in tiled,
                                         reads_grad_input_inside(g, node, b.inside), region.rows)
        elif node.op == NLL_FORWARD:
            writes += nll_forward_part(b, node, k, n, part, totals[v])
        else:
            writes += row_op_part(b, node, k, need, part, region.rows)
    return writes


def _divide_means(b: Parts, region: Region, totals: dict[int, int], writes: list[int]) -> None:
    """A mean loss handed on: the summed loss divided by the summed weight after every part's
    count (the division appended to `writes`)."""
    g = b.g
    for v, total in totals.items():
        node = g.nodes[v]
        loss = node.outputs[0]
        if node.args[3] == REDUCTION_MEAN and loss in region.added:
            counted = [w for w in writes if b.edit.graph.nodes[w].args[0] == TensorRef(total)]
            mean = b.add("aten.div_.Tensor", (TensorRef(loss), TensorRef(total)), node,
                         f"{g.tensors[loss].name or loss}_mean")
            b.edit.add_control(mean.id, counted)       # after every part's count
            writes.append(mean.id)


def _finish(g: Graph, order: Sequence[int], region: Region, b: Parts, allocs: list[int],
            writes: list[int], first: Node) -> Rewrite:
    """Remove the originals, order and guard the new nodes: allocations, then the parts in
    the order made; every reader of a handed-on tensor after the last write of it."""
    edit = b.edit
    handed = set(region.rows) | set(region.added)
    preds = sorted({p for v in region.nodes for p in g.control.get(v, ()) if p not in b.inside})
    new = [*allocs, *b.made]
    if preds:
        for v in new:
            edit.add_control(v, preds)
    chained: dict[int, int] = {}      # storage -> its last write, so writes of one tensor stay in order
    for w in writes:
        target = edit.graph.nodes[w].args[0]
        s = edit.graph.tensors[target.id].storage if isinstance(target, TensorRef) else -1
        if s in chained:
            edit.add_control(w, [chained[s]])
        chained[s] = w
    last = {g.tensors[t].storage: chained[g.tensors[t].storage] for t in handed if g.tensors[t].storage in chained}
    for t in handed:
        for u in g.users(t):
            if u not in b.inside:
                edit.add_control(u, [last[g.tensors[t].storage]])
    for m, after in g.control.items():                 # waiters on a region node wait for the parts
        if m not in b.inside and b.inside.intersection(after):
            edit.set_control(m, [*(p for p in after if p not in b.inside), new[-1]])
    capture = _placed(g, g.order, b.inside, new)
    new_order = _placed(g, order, b.inside, new)
    edit.remove_nodes(region.nodes, keep_tensors=handed)
    edit.remove_unused_storages()
    edit.set_order(capture)
    what = (f"run {len(region.nodes)} node(s) from {describe_node(g, first.id)} in {b.n} parts along the rows "
            "(spatial fission, halos recomputed)")
    return Rewrite(graph=edit.finish(), order=new_order, added=tuple(new), changed=(),
                   removed=tuple(region.nodes), description=what)


def _placed(g: Graph, seq: Sequence[int], inside: set[int], new: Sequence[int]) -> list[int]:
    """`seq` with the region replaced by `new` at its last node, the nodes between that depend
    on it right after."""
    after = downstream(g, seq, inside)
    moved = set(after)
    last = max(i for i, v in enumerate(seq) if v in inside)
    out: list[int] = []
    for i, v in enumerate(seq):
        if i == last:
            out += [*new, *after]
        elif v not in inside and v not in moved:
            out.append(v)
    return out
