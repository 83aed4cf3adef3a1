"""Spatial fission: a region of convolutions, element-wise ops and a per-pixel loss runs in n
parts along the height of its images (NCHW dim 2), one after another, each part reading the
rows its outputs need (halos), so only one part's intermediates and kernel scratch are live at
a time. What ops a region may hold and their row geometry: peakcut.transform.spatial_ops.

    r = split_rows(g, order, nodes, n)          # a Rewrite; why_not_split_rows says why not

What a region may hold (why_not_split_rows refuses the rest, naming the node):
- aten.convolution (2-D, not transposed): output rows [a, b) read input rows
  [a*s - p, (b-1)*s - p + d*(k-1) + 1) (stride s, padding p, dilation d, kernel k along the
  height). Rows outside the image are the padding: a part at the border pads its slice with
  zeros itself (aten.constant_pad_nd) and the part's convolution pads the height by 0;
- element-wise ops (the registry's kind, not random, nothing written in place) on [N, C, H, W]
  tensors; an input of height 1, or of one element, is broadcast, not split;
- a softmax or log-softmax (and their backwards) along another dim than the rows, and a
  detach of an image: like element-wise ops;
- aten.nll_loss2d_forward / _backward (unweighted, reduction mean or sum), a per-pixel loss:
  part k sums the loss of its own rows (reduction sum) into the loss and their count into a
  total; a mean divides once after the last part (`<loss>_mean`). The backward runs per part
  on the whole count, which must not be made in the region (peakcut.fission.loss computes it
  up front from the targets, for a mean only); a region through the loss needs that first
  (a summed loss's backward still reads the forward's total weight: a region holds one of them);
- aten.convolution_backward (2-D, not transposed): a part takes the rows of grad_output it
  owns and the input rows they read (with halos, padded as above); its grad_input rows add
  into the whole gradient (rows two parts read get both parts' sums): where the parts' rows
  tile the image (overlapping only the previous part's: _tiles), part k copies the rows past
  the previous part's and adds only the overlap, into a gradient never zeroed (a zeroed
  gradient and whole-part adds cost U-Net's top convolution's backward at n = 4 +6.0 ms on
  the RTX 3090 profile, the copies +3.7 ms); its grad_weight and grad_bias add up over the
  parts. Its outputs are not read inside the region, except a pointwise backward's grad_input
  (kernel 1, stride 1, no padding along the height: its rows are exactly its grad_output
  rows', not partial sums), which a part reads as its own rows (a part needing more of them,
  a gradient's halo, is refused). A backward that makes only grad_input
  (after split_conv_grads) reads its input's shape, never its values, yet ATen makes the input
  contiguous first: its parts get a contiguous view of that shape on the input's storage
  (`<tensor>_rows<a>_<b>_shape_only`) instead of a row slice ATen would copy (paper U-Net++'s
  peak at n = 4: -5.1% instead of -3.0%, simulated).

Each tensor the region hands on (read outside it, or a program output) is preallocated whole
before the parts (the same tensor id, so its readers are untouched); of an output of a
convolution or an element-wise op, part k writes the rows it owns, [k*H//n, (k+1)*H//n). A
tensor made inside the region is computed in part k on the rows that its own rows and the
halos of its readers in the region need: halo rows are computed again in the next part (the
cost of a spatial split, priced by the simulator on the rewritten graph). Nodes of the part
are named `<node>_rows<a>_<b>`, slices with halos `<tensor>_rows<a>_<b>`, so the generated
program reads as the parts it runs (written out, not as a loop: the parts at the borders
differ from the inner ones).

Numbers: each output row is computed from the same input rows by the same op; what changes is
the summation order of the convolution's grad_input rows at part borders, of grad_weight and
grad_bias (summed over the parts), and of a loss's sum and pixel count (summed per part, then
added in the loss's dtype: in bfloat16 a few units of the last place from eager's), as in
batch fission.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.ir.edit import GraphEditor, rewired
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.tensor import contiguous_strides
from peakcut.transform.rewrite import Rewrite, RuleError, describe_node, describe_tensor, positions
from peakcut.transform.spatial_ops import (
    CONV,
    CONV_BACKWARD,
    NLL_BACKWARD,
    NLL_FORWARD,
    REDUCTION_MEAN,
    REDUCTION_SUM,
    ROW_LOCAL_VIEWS,
    ROWS,
    TARGET_ROWS,
    Rows,
    Window,
    conv_window,
    is_pointwise,
    owned,
    reads_grad_input_inside,
    reads_input_shape_only,
    split_inputs,
    why_not_node,
    with_height_padding,
)

__all__ = ["CONV", "CONV_BACKWARD", "NLL_BACKWARD", "NLL_FORWARD", "ROW_LOCAL_VIEWS", "ROWS", "Rows",
           "is_pointwise", "owned", "reads_input_shape_only", "split_inputs", "split_rows", "why_not_node",
           "why_not_split_rows"]

@dataclass(frozen=True)
class _Region:
    nodes: tuple[int, ...]            # in `order`
    rows: tuple[int, ...]             # outputs handed on whose rows the parts write (copy_)
    added: tuple[int, ...]            # outputs handed on that the parts add into (grad_input, weight, bias)


def _region(g: Graph, order: Sequence[int], nodes: Sequence[int], n: int) -> _Region | str:
    if not nodes:
        return "no nodes given"
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        return f"n={n!r}: expected a number of parts >= 2"
    missing = [v for v in nodes if v not in g.nodes]
    if missing:
        return f"node {missing[0]} is not in the graph"
    for v in nodes:
        reason = why_not_node(g, v)
        if reason:
            return reason
    pos = positions(order)
    members = tuple(sorted(set(nodes), key=pos.__getitem__))
    inside = set(members)
    program = set(g.outputs)
    rows: list[int] = []
    added: list[int] = []
    for v in members:
        node = g.nodes[v]
        for j, t in enumerate(node.outputs):     # one output, a convolution's backward's three, a loss's two
            if t is None:
                continue
            outside = [u for u in g.users(t) if u not in inside]
            inner = [u for u in g.users(t) if u in inside]
            summed = node.op == NLL_FORWARD or (node.op == CONV_BACKWARD
                                                 and not (j == 0 and inner and is_pointwise(g, node)))
            if summed:                 # the parts add up to it: a gradient, a loss or its count
                if inner:
                    hint = (" (peakcut.fission.loss.detach_loss computes a mean loss's count up front)"
                            if node.op == NLL_FORWARD else "")
                    return (f"{describe_node(g, inner[0])} reads {describe_tensor(g, t)}, which the parts of "
                            f"{describe_node(g, v)} only add up to: it must be read outside the region{hint}")
                if node.op == NLL_FORWARD and not (outside or t in program):
                    continue
                added.append(t)
            elif outside or t in program:
                rows.append(t)
            else:
                continue
            meta = g.tensors[t]
            if meta.storage_offset != 0 or g.storage_owner_of(meta.storage) != v:
                return f"{describe_tensor(g, t)} of {describe_node(g, v)} does not own its storage"
    for t in rows:
        if g.tensors[t].shape[ROWS] < n:
            return f"{describe_tensor(g, t)} has {g.tensors[t].shape[ROWS]} rows: fewer than n={n} parts"
    for v in members:
        if g.nodes[v].op == CONV_BACKWARD:
            go = g.nodes[v].args[0]
            if isinstance(go, TensorRef) and g.tensors[go.id].shape[ROWS] < n:
                return f"the grad_output of {describe_node(g, v)} has fewer rows than n={n} parts"
    for v in members:
        if g.nodes[v].op == NLL_FORWARD and g.tensors[g.nodes[v].args[0].id].shape[ROWS] < n:
            return f"the scores {describe_node(g, v)} reads have fewer rows than n={n} parts"
    for seq in (order, g.order):
        reason = _why_not_convex(g, seq, inside)
        if reason:
            return reason
    region = _Region(members, tuple(rows), tuple(added))
    return _why_not_exact(g, region, n) or region


def _why_not_exact(g: Graph, region: _Region, n: int) -> str | None:
    """Why some part could not make what it needs: a tensor made in the region that no part
    needs rows of, though it is read there (as a whole: a convolution's weight, a broadcast
    [N, C, 1, 1] input), or a pointwise backward's grad_input rows beyond its own grad_output
    rows (a halo of it)."""
    inside = set(region.nodes)
    first = _needs(g, region, 0, n)      # the same tensors get rows in every part
    for v in region.nodes:
        node = g.nodes[v]
        if node.op in (CONV_BACKWARD, NLL_FORWARD):
            continue
        (out,) = node.output_ids()
        if out not in first and any(u in inside for u in g.users(out)):
            return (f"{describe_tensor(g, out)} of {describe_node(g, v)} is read in the region only whole "
                    "(not along its rows): make it outside the region")
    backs = [g.nodes[v] for v in region.nodes
             if g.nodes[v].op == CONV_BACKWARD and reads_grad_input_inside(g, g.nodes[v], inside)]
    for k in range(n if backs else 0):
        need = first if k == 0 else _needs(g, region, k, n)
        for node in backs:
            mine = owned(g.tensors[node.args[0].id].shape[ROWS], k, n)
            gi = node.outputs[0]
            rows = None if gi is None else need.get(gi)
            if rows is not None and (rows.start < mine.start or rows.stop > mine.stop):
                return (f"part {k} of {n} would need rows {rows.start}..{rows.stop} of the grad_input of "
                        f"{describe_node(g, node.id)}, beyond the rows {mine.start}..{mine.stop} it makes: "
                        "a halo of a gradient is not recomputed")
    return None


def _downstream(g: Graph, seq: Sequence[int], inside: set[int]) -> list[int]:
    """The nodes between the region's first and last node in `seq` that depend on it: they
    run after the parts."""
    at = [i for i, v in enumerate(seq) if v in inside]
    after: set[int] = set()
    for u in seq[at[0]:at[-1]]:
        if u not in inside and any(p in inside or p in after for p in g.predecessors(u)):
            after.add(u)
    return [u for u in seq[at[0]:at[-1]] if u in after]


def _why_not_convex(g: Graph, seq: Sequence[int], inside: set[int]) -> str | None:
    """Why the region cannot run as one block at its last node in `seq` (None: it can)."""
    after = set(_downstream(g, seq, inside))
    read = {g.tensors[t].storage for v in inside for t in g.nodes[v].input_ids()}
    at = [i for i, v in enumerate(seq) if v in inside]
    for u in seq[at[0]:at[-1] + 1]:           # the last node's inputs too
        if u in inside:
            if after.intersection(g.predecessors(u)):
                p = next(iter(after.intersection(g.predecessors(u))))
                return (f"{describe_node(g, u)} depends on {describe_node(g, p)}, which depends on the region: "
                        "the region is not convex")
        elif u not in after and {g.tensors[t].storage for t in g.mutated_tensors(u)} & read:
            return f"{describe_node(g, u)} writes in place what the region reads, between its nodes"
    return None


def _placed(g: Graph, seq: Sequence[int], inside: set[int], new: Sequence[int]) -> list[int]:
    """`seq` with the region replaced by `new` at its last node, the nodes between that depend
    on it right after."""
    after = _downstream(g, seq, inside)
    moved = set(after)
    last = max(i for i, v in enumerate(seq) if v in inside)
    out: list[int] = []
    for i, v in enumerate(seq):
        if i == last:
            out += [*new, *after]
        elif v not in inside and v not in moved:
            out.append(v)
    return out


def why_not_split_rows(g: Graph, order: Sequence[int], nodes: Sequence[int], n: int) -> str | None:
    """Why `nodes` cannot run in `n` parts along their rows (None: split_rows applies)."""
    region = _region(g, order, nodes, n)
    return region if isinstance(region, str) else None


class _Parts:
    """Builds the parts of one region on a GraphEditor."""

    def __init__(self, g: Graph, region: _Region, n: int) -> None:
        self.g, self.n = g, n
        self.edit = GraphEditor(g)
        self.made: list[int] = []
        self.inside = set(region.nodes)
        self.handed = set(region.rows) | set(region.added)
        self.slices: dict[tuple[int, Rows, int], int] = {}   # of whole tensors, in the part being built

    def add(self, op: str, args: tuple[Any, ...], like: Node, name: str, multi_output: bool = False,
            kwargs: dict[str, Any] | None = None) -> Node:
        node = self.edit.add_op(op, args, kwargs or {}, name=name, phase=like.phase, module=like.module,
                                multi_output=multi_output)
        self.made.append(node.id)
        return node

    def rows_of(self, t: int, rows: Rows, part: dict[int, tuple[int, Rows]], like: Node, dim: int = ROWS) -> int:
        """Tensor `t` cut to `rows` (within its height, dim `dim`): its part tensor or a slice of it."""
        if t in part:
            tensor, have = part[t]
        else:
            tensor, have = t, Rows(0, self.g.tensors[t].shape[dim])
        if rows == have:
            return tensor
        key = (t, rows, dim)
        if t not in part and key in self.slices:      # a whole tensor two nodes of the part read
            return self.slices[key]
        name = f"{self.g.tensors[t].name or t}_rows{rows.start}_{rows.stop}"
        view = self.add("aten.slice.Tensor", (TensorRef(tensor), dim, rows.start - have.start,
                                              rows.stop - have.start), like, name)
        if t not in part:
            self.slices[key] = view.output_ids()[0]
        return view.output_ids()[0]

    def padded(self, t: int, rows: Rows, height: int, part: dict[int, tuple[int, Rows]], like: Node) -> tuple[int, int]:
        """Tensor `t`'s rows `rows` (unclipped), zero-padded where they leave the image: the
        tensor and the rows of padding on top."""
        inner = rows.clip(height)
        x = self.rows_of(t, inner, part, like)
        top, bottom = inner.start - rows.start, rows.stop - inner.stop
        if top or bottom:
            name = f"{self.g.tensors[t].name or t}_rows{rows.start}_{rows.stop}_padded"
            x = self.add("aten.constant_pad_nd.default", (TensorRef(x), [0, 0, top, bottom], 0.0),
                         like, name).output_ids()[0]
        return x, top


def _needs(g: Graph, region: _Region, k: int, n: int) -> dict[int, Rows]:
    """Per tensor made in the region, the rows part k computes of it (module doc)."""
    need: dict[int, Rows] = {}
    made = {t for v in region.nodes for t in g.nodes[v].output_ids()}
    for t in region.rows:
        need[t] = owned(g.tensors[t].shape[ROWS], k, n)

    def want(t: int, rows: Rows) -> None:
        if t in made:
            rows = rows.clip(g.tensors[t].shape[ROWS])
            need[t] = rows.hull(need.get(t))

    for v in reversed(region.nodes):
        node = g.nodes[v]
        if node.op == CONV_BACKWARD:
            go, x = node.args[0], node.args[1]
            w = conv_window(g, node, 2, 4)
            if isinstance(go, TensorRef) and isinstance(x, TensorRef) and isinstance(w, Window):
                mine = owned(g.tensors[go.id].shape[ROWS], k, n)
                want(go.id, mine)
                want(x.id, w.reads(mine))
            continue
        if node.op == NLL_FORWARD:       # its sum counts each row once: the part's own rows
            x = node.args[0].id
            want(x, owned(g.tensors[x].shape[ROWS], k, n))
            continue
        (out,) = node.output_ids()
        rows = need.get(out)
        if rows is None:
            continue
        if node.op == NLL_BACKWARD:
            want(node.args[1].id, rows)
            continue
        if node.op == CONV:
            w = conv_window(g, node, 1, 3)
            if isinstance(node.args[0], TensorRef) and isinstance(w, Window):
                want(node.args[0].id, w.reads(rows))
            continue
        split = split_inputs(g, node)
        for t in split if isinstance(split, list) else ():
            want(t, rows)
    return {t: r for t, r in need.items() if t in made}


def split_rows(g: Graph, order: Sequence[int], nodes: Sequence[int], n: int) -> Rewrite:
    """Run the region `nodes` in `n` parts along its images' rows (module doc). Raises
    RuleError (why_not_split_rows's reason) when it does not apply."""
    region = _region(g, order, nodes, n)
    if isinstance(region, str):
        raise RuleError(region)
    b = _Parts(g, region, n)
    first = g.nodes[region.nodes[0]]
    made_by = {t: g.nodes[v] for v in region.nodes for t in g.nodes[v].output_ids()}
    tiled = {t for v in region.nodes if g.nodes[v].op == CONV_BACKWARD and _tiles(g, g.nodes[v], n)
             for t in g.nodes[v].outputs[:1] if t is not None}
    allocs = []
    for t in (*region.rows, *region.added):       # whole tensors (the same ids), before the parts
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
    totals = {}           # per loss: the tensor its parts' total weights add into
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
    writes: list[int] = []
    for k in range(n):
        need = _needs(g, region, k, n)
        part: dict[int, tuple[int, Rows]] = {}
        b.slices.clear()
        for v in region.nodes:
            node = g.nodes[v]
            if node.op == CONV_BACKWARD:
                writes += _conv_backward_part(b, node, k, n, part, node.outputs[0] in tiled,
                                              reads_grad_input_inside(g, node, b.inside), region.rows)
                continue
            if node.op == NLL_FORWARD:
                writes += _nll_forward_part(b, node, k, n, part, totals[v])
                continue
            (out,) = node.output_ids()
            rows = need[out]
            tag = f"_rows{rows.start}_{rows.stop}"
            if node.op == NLL_BACKWARD:
                x, target = node.args[1], node.args[2]
                args = (node.args[0], TensorRef(b.rows_of(x.id, rows, part, node)),
                        TensorRef(b.rows_of(target.id, rows, {}, node, TARGET_ROWS)), *node.args[3:])
                kwargs = dict(node.kwargs)
            elif node.op == CONV:
                w = conv_window(g, node, 1, 3)
                x = node.args[0]
                if not isinstance(w, Window) or not isinstance(x, TensorRef):
                    raise RuleError(f"internal: {describe_node(g, v)} changed")
                xp, _ = b.padded(x.id, w.reads(rows), g.tensors[x.id].shape[ROWS], part, node)
                args = (TensorRef(xp), *node.args[1:4], with_height_padding(node.args[4]), *node.args[5:])
                kwargs = dict(node.kwargs)
            else:
                split = split_inputs(g, node)
                if isinstance(split, str):
                    raise RuleError(split)
                mapping = {t: b.rows_of(t, rows, part, node) for t in split}
                rewritten = rewired(node, mapping)
                args, kwargs = rewritten.args, dict(rewritten.kwargs)
            made = b.add(node.op, args, node, f"{node.name or v}{tag}", kwargs=kwargs)
            part[out] = (made.output_ids()[0], rows)
            if out in region.rows:
                mine = owned(g.tensors[out].shape[ROWS], k, n)
                into = b.rows_of(out, mine, {}, node)
                value = b.rows_of(out, mine, part, node)
                writes.append(b.add("aten.copy_.default", (TensorRef(into), TensorRef(value)), node,
                                    f"{g.tensors[out].name or out}_write{tag}").id)
    for v, total in totals.items():       # a mean: the summed loss over the summed weight
        node = g.nodes[v]
        loss = node.outputs[0]
        if node.args[3] == REDUCTION_MEAN and loss in region.added:
            counted = [w for w in writes if b.edit.graph.nodes[w].args[0] == TensorRef(total)]
            mean = b.add("aten.div_.Tensor", (TensorRef(loss), TensorRef(total)), node,
                         f"{g.tensors[loss].name or loss}_mean")
            b.edit.add_control(mean.id, counted)       # after every part's count
            writes.append(mean.id)
    return _finish(g, order, region, b, allocs, writes, first)


def _nll_forward_part(b: _Parts, node: Node, k: int, n: int, part: dict[int, tuple[int, Rows]],
                      total: int) -> list[int]:
    """Part k of a per-pixel nll_loss2d: the summed loss of its own rows added into the loss,
    their count (total weight) into `total`; a mean divides after the last part."""
    g = b.g
    x, target = node.args[0], node.args[1]
    mine = owned(g.tensors[x.id].shape[ROWS], k, n)
    x_k = b.rows_of(x.id, mine, part, node)
    target_k = b.rows_of(target.id, mine, {}, node, TARGET_ROWS)
    tag = f"_rows{mine.start}_{mine.stop}"
    made = b.add(NLL_FORWARD, (TensorRef(x_k), TensorRef(target_k), None, REDUCTION_SUM, *node.args[4:]), node,
                 f"{node.name or node.id}_sum{tag}", multi_output=True)
    loss_k, weight_k = made.outputs
    writes = []
    for into, value, what in ((node.outputs[0], loss_k, "sum"), (total, weight_k, "total_weight")):
        if value is not None and (into == total or into in b.handed):
            writes.append(b.add("aten.add_.Tensor", (TensorRef(into), TensorRef(value)), node,
                                f"{node.name or node.id}_{what}_add{tag}").id)
    return writes


def _grad_input_rows(g: Graph, node: Node, k: int, n: int) -> Rows:
    """The input rows (within the image) whose gradient part k of a convolution's backward makes."""
    go, x = node.args[0], node.args[1]
    w = conv_window(g, node, 2, 4)
    if not isinstance(go, TensorRef) or not isinstance(x, TensorRef) or not isinstance(w, Window):
        raise RuleError(f"internal: {describe_node(g, node.id)} changed")
    return w.reads(owned(g.tensors[go.id].shape[ROWS], k, n)).clip(g.tensors[x.id].shape[ROWS])


def _tiles(g: Graph, node: Node, n: int) -> bool:
    """Whether the parts' grad_input rows cover the image, each overlapping only the part
    before it (a halo): then part k copies its rows past the previous part's and adds only the
    overlap, into a gradient never zeroed. A strided window that skips input rows does not
    tile: its gradient is zeroed and every part adds (the skipped rows stay 0)."""
    rows = [_grad_input_rows(g, node, k, n) for k in range(n)]
    if rows[0].start != 0 or rows[-1].stop != g.tensors[node.args[1].id].shape[ROWS]:
        return False
    for k in range(1, n):
        if rows[k].start > rows[k - 1].stop or rows[k].stop < rows[k - 1].stop:
            return False
        if k >= 2 and rows[k].start < rows[k - 2].stop:
            return False
    return True


def _conv_backward_part(b: _Parts, node: Node, k: int, n: int, part: dict[int, tuple[int, Rows]],
                        tiled: bool, local: bool = False, handed_rows: Sequence[int] = ()) -> list[int]:
    """Part k of a convolution's backward: its own grad_output rows, the input rows they read;
    grad_input rows added into the whole gradient (where `tiled`, _tiles: copied past the
    previous part's rows, added on the overlap), grad_weight and grad_bias added up. Where
    `local` (reads_grad_input_inside), the part's grad_input rows are the region's to read,
    and copied into the whole gradient only where it is handed on (in `handed_rows`)."""
    g = b.g
    go, x = node.args[0], node.args[1]
    w = conv_window(g, node, 2, 4)
    if not isinstance(go, TensorRef) or not isinstance(x, TensorRef) or not isinstance(w, Window):
        raise RuleError(f"internal: {describe_node(g, node.id)} changed")
    height = g.tensors[x.id].shape[ROWS]
    mine = owned(g.tensors[go.id].shape[ROWS], k, n)
    reads = w.reads(mine)
    go_k = b.rows_of(go.id, mine, part, node)
    if reads_input_shape_only(g, node) and x.id not in part and len(reads) <= height:
        x_k, top = _shape_only(b, x.id, reads, height, node)
    else:
        x_k, top = b.padded(x.id, reads, height, part, node)
    args = (TensorRef(go_k), TensorRef(x_k), *node.args[2:5], with_height_padding(node.args[5]), *node.args[6:])
    tag = f"_rows{mine.start}_{mine.stop}"
    made = b.add(node.op, args, node, f"{node.name or node.id}{tag}", multi_output=node.multi_output)
    writes = []
    inner = reads.clip(height)
    for j, (t, t_k) in enumerate(zip(node.outputs, made.outputs, strict=True)):
        if t is None or t_k is None:
            continue
        if j == 0 and local:
            part[t] = (t_k, mine)
            if t in handed_rows:
                writes.append(b.add("aten.copy_.default", (TensorRef(b.rows_of(t, mine, {}, node)), TensorRef(t_k)),
                                    node, f"{g.tensors[t].name or t}_write{tag}").id)
            continue
        if j > 0:
            writes.append(b.add("aten.add_.Tensor", (TensorRef(t), TensorRef(t_k)), node,
                                f"{g.tensors[t].name or t}_add{tag}").id)
            continue
        seen = _grad_input_rows(g, node, k - 1, n).stop if tiled and k > 0 else inner.start
        spans = ([(Rows(inner.start, seen), "aten.add_.Tensor", "add"), (Rows(seen, inner.stop), "aten.copy_.default", "write")]
                 if tiled else [(inner, "aten.add_.Tensor", "add")])
        for rows, op, verb in spans:
            if not len(rows):
                continue
            value = t_k
            if len(rows) != b.edit.graph.tensors[t_k].shape[ROWS]:
                start = top + rows.start - inner.start
                value = b.add("aten.slice.Tensor", (TensorRef(t_k), ROWS, start, start + len(rows)), node,
                              f"{g.tensors[t].name or t}_part{k}_rows{rows.start}_{rows.stop}").output_ids()[0]
            into = b.rows_of(t, rows, {}, node)
            writes.append(b.add(op, (TensorRef(into), TensorRef(value)), node,
                                f"{g.tensors[t].name or t}_{verb}_rows{rows.start}_{rows.stop}").id)
    return writes


def _shape_only(b: _Parts, x: int, rows: Rows, height: int, like: Node) -> tuple[int, int]:
    """A contiguous tensor of the padded shape of `x`'s rows `rows` (unclipped), viewing x's
    own elements from its first one (x is contiguous and at least that large): a
    grad_input-only backward reads its shape, not its values (reads_input_shape_only). The
    rows of padding on top, as `_Parts.padded` gives them. Only for an x made outside the
    region (one made inside exists per part, not whole)."""
    meta = b.g.tensors[x]
    shape = [*meta.shape[:ROWS], len(rows), *meta.shape[ROWS + 1:]]
    name = f"{meta.name or x}_rows{rows.start}_{rows.stop}_shape_only"
    view = b.add("aten.as_strided.default", (TensorRef(x), shape, list(contiguous_strides(tuple(shape))),
                                             meta.storage_offset), like, name)
    return view.output_ids()[0], rows.clip(height).start - rows.start


def _finish(g: Graph, order: Sequence[int], region: _Region, b: _Parts, allocs: list[int],
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
