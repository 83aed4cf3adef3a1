"""Part k of each kind of node in a spatial region: a convolution, an element-wise op or a
loss's backward on its rows (with halos), a per-pixel loss's sum and count, and a
convolution's backward whose gradients add into the whole ones (package doc)."""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.edit import rewired
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.tensor import contiguous_strides
from peakcut.transform.rewrite import RuleError, describe_node
from peakcut.transform.spatial.ops import (
    CONV,
    NLL_BACKWARD,
    NLL_FORWARD,
    REDUCTION_SUM,
    ROWS,
    TARGET_ROWS,
    Rows,
    Window,
    conv_window,
    owned,
    reads_input_shape_only,
    split_inputs,
    with_height_padding,
)
from peakcut.transform.spatial.parts import Parts


def row_op_part(b: Parts, node: Node, k: int, need: dict[int, Rows], part: dict[int, tuple[int, Rows]],
                handed_rows: Sequence[int]) -> list[int]:
    """Part k of a convolution, an element-wise op or a per-pixel loss's backward: the node on
    the rows of its output part k computes (`need`), reading its inputs' rows (with halos,
    zero-padded past the image's borders); where its output is handed on (in `handed_rows`),
    the rows part k owns are copied into it. Returns those writes."""
    g, n, v = b.g, b.n, node.id
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
    if out in handed_rows:
        mine = owned(g.tensors[out].shape[ROWS], k, n)
        into = b.rows_of(out, mine, {}, node)
        value = b.rows_of(out, mine, part, node)
        return [b.add("aten.copy_.default", (TensorRef(into), TensorRef(value)), node,
                      f"{g.tensors[out].name or out}_write{tag}").id]
    return []


def nll_forward_part(b: Parts, node: Node, k: int, n: int, part: dict[int, tuple[int, Rows]],
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


def tiles(g: Graph, node: Node, n: int) -> bool:
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


def conv_backward_part(b: Parts, node: Node, k: int, n: int, part: dict[int, tuple[int, Rows]],
                       tiled: bool, local: bool = False, handed_rows: Sequence[int] = ()) -> list[int]:
    """Part k of a convolution's backward: its own grad_output rows, the input rows they read;
    grad_input rows added into the whole gradient (where `tiled`, tiles: copied past the
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


def _shape_only(b: Parts, x: int, rows: Rows, height: int, like: Node) -> tuple[int, int]:
    """A contiguous tensor of the padded shape of `x`'s rows `rows` (unclipped), viewing x's
    own elements from its first one (x is contiguous and at least that large): a
    grad_input-only backward reads its shape, not its values (reads_input_shape_only). The
    rows of padding on top, as `Parts.padded` gives them. Only for an x made outside the
    region (one made inside exists per part, not whole)."""
    meta = b.g.tensors[x]
    shape = [*meta.shape[:ROWS], len(rows), *meta.shape[ROWS + 1:]]
    name = f"{meta.name or x}_rows{rows.start}_{rows.stop}_shape_only"
    view = b.add("aten.as_strided.default", (TensorRef(x), shape, list(contiguous_strides(tuple(shape))),
                                             meta.storage_offset), like, name)
    return view.output_ids()[0], rows.clip(height).start - rows.start
