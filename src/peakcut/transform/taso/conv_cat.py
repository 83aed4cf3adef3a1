"""split_conv_cat: a convolution over a channel concatenation runs as one convolution per
concatenated tensor, summed; its backward as one backward per tensor.

A convolution sums over its input channels (groups = 1), so

    conv(cat([x_1, ..., x_k], 1), W, b) = conv(x_1, W_1, b) + conv(x_2, W_2) + ... + conv(x_k, W_k)

with W_i the slice of W over x_i's channels (dim 1 of W; dim 0 for a transposed convolution).
The backward (aten.convolution_backward reading the concatenation as its input) becomes one
backward per x_i: its input gradient is grad x_i itself (the readers of the slices autograd
cut from the whole input gradient read it; any other reader reads a cat of them), the weight
gradient is the cat of the pieces' along W's input channels, the bias gradient comes from
the first piece.

What it saves: the concatenation is a copy of tensors that are mostly kept anyway (a U-Net's
skip connection is also read by the max-pool backward), and autograd keeps the copy from the
forward to the backward, where the backward also makes an input gradient of the whole
concatenation's size. After the rewrite nothing is copied: each x_i is read where it is, and
each backward makes only its own piece's gradient. What it costs: k smaller convolutions for
one (the same FLOPs), k - 1 additions of the output in the forward, a cat of the (small)
weight gradient in the backward; the simulator prices both. Numbers: the forward's sum over
input channels runs as k partial sums (rounding, not bit-equal); the gradients of x_i and W
are the same sums as before.

The site is a cat node (every convolution and backward reading it is rewritten); a cat also
read by anything else, along another dimension than the channels, or read by a grouped
convolution does not apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.registry import CONV, CONV_BACKWARD, conv_backward_mask
from peakcut.ir.tags import RematTag
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    ancestors,
    compose_rewrites,
    describe_node,
    describe_tensor,
    node_calling,
    writers_of,
)
from peakcut.transform.taso.edit import Edit
from peakcut.transform.taso.matmul import ADD, CAT, SLICE
from peakcut.transform.taso.tag import TasoTag

RULE = "split_conv_cat"
# argument positions: convolution(input, weight, bias, stride, padding, dilation, transposed,
# output_padding, groups); convolution_backward(grad_output, input, weight, bias_sizes, stride,
# padding, dilation, transposed, output_padding, groups, output_mask)
_CONV_INPUT, _CONV_WEIGHT, _CONV_TRANSPOSED, _CONV_GROUPS = 0, 1, 6, 8
_BW_GRAD, _BW_INPUT, _BW_WEIGHT, _BW_TRANSPOSED, _BW_GROUPS, _BW_MASK = 0, 1, 2, 7, 9, 10


@dataclass(frozen=True)
class ConvCat:
    """A concatenation the rule splits: the cat node, the tensors it concatenates and their
    channel counts, and the convolutions (forward) and backwards reading it."""

    cat: int
    pieces: tuple[int, ...]
    sizes: tuple[int, ...]
    forward: tuple[int, ...]
    backward: tuple[int, ...]

    def touched(self, g: Graph) -> tuple[int, ...]:
        """Every node the rewrite removes: the cat, its readers, the slices of their input
        gradients it replaces (a site names them all, so the search sees what it touches)."""
        slices = [r for b in self.backward for r in input_gradient_readers(g, b, self)[0]]
        return (self.cat, *self.forward, *self.backward, *slices)

    def bounds(self) -> list[tuple[int, int]]:
        """The channel range [start, stop) of each piece in the concatenation."""
        out, start = [], 0
        for s in self.sizes:
            out.append((start, start + s))
            start += s
        return out


def _arg(node: Node, i: int, default: object = None) -> object:
    """Positional argument i of node (default where the call leaves it out)."""
    return node.args[i] if len(node.args) > i else default


def _weight_dim(node: Node) -> int:
    """The dimension of the weight over the input channels (0 for a transposed convolution)."""
    transposed = _arg(node, _BW_TRANSPOSED if node.op == CONV_BACKWARD else _CONV_TRANSPOSED, False)
    return 0 if transposed else 1


def _why_not_reader(g: Graph, out: int, nid: int, channels: int) -> str | None:
    node = g.nodes[nid]
    what = describe_node(g, nid)
    if node.op == CONV:
        slot, groups, weight = _CONV_INPUT, _arg(node, _CONV_GROUPS, 1), _arg(node, _CONV_WEIGHT)
    elif node.op == CONV_BACKWARD:
        slot, groups, weight = _BW_INPUT, _arg(node, _BW_GROUPS, 1), _arg(node, _BW_WEIGHT)
    else:
        return (f"{what} reads the concatenation {describe_tensor(g, out)}: only convolutions and "
                "their backwards reading it as their input are split")
    if node.kwargs:
        return f"{what} takes keyword arguments {sorted(node.kwargs)}"
    if node.tags.get(RematTag) is not None:
        return f"{what} is a recompute (its checkpoint would lose track of the parts)"
    refs = [i for i, a in enumerate(node.args) if isinstance(a, TensorRef) and a.id == out]
    if refs != [slot]:
        return f"{what} reads the concatenation other than as its input"
    if groups != 1:
        return f"{what} is a grouped convolution ({groups} groups): its channels are not summed over all"
    if not isinstance(weight, TensorRef):
        return f"{what} has no weight tensor"
    wdim = _weight_dim(node)
    if g.tensors[weight.id].shape[wdim] != channels:
        return f"the weight of {what} has {g.tensors[weight.id].shape[wdim]} input channels, not {channels}"
    return None


def plan_conv_cat(g: Graph, order: Sequence[int], cat: int, *, checked: bool = False) -> ConvCat | str:
    """What split_conv_cat does at the cat node `cat`, or why it does not apply. checked: the
    caller has verified that `order` is an order of g."""
    node = node_calling(g, order, cat, CAT, "a concatenation", checked=checked)
    if isinstance(node, str):
        return node
    what = describe_node(g, cat)
    tensors = node.args[0] if node.args else None
    outs = node.output_ids()
    if not isinstance(tensors, (list, tuple)) or len(outs) != 1:
        return f"{what} has no list of tensors"
    refs = [t for t in tensors if isinstance(t, TensorRef)]
    if len(refs) != len(tensors) or len(refs) < 2:
        return f"{what} does not concatenate two or more tensors"
    out = outs[0]
    meta = g.tensors[out]
    dim = _arg(node, 1, node.kwargs.get("dim", 0))
    if not isinstance(dim, int) or len(meta.shape) < 3 or dim % len(meta.shape) != 1:
        return f"{what} does not concatenate images along their channels (dim 1)"
    pieces = tuple(r.id for r in refs)
    if any(len(g.tensors[t].shape) != len(meta.shape) or g.tensors[t].dtype != meta.dtype for t in pieces):
        return f"{what} concatenates tensors of another rank or dtype than its result"
    sizes = tuple(g.tensors[t].shape[1] for t in pieces)
    if any(s <= 0 for s in sizes):
        return f"{what} concatenates a tensor without channels"
    if node.tags.get(RematTag) is not None:
        return f"{what} is a recompute (its checkpoint would lose track of the parts)"
    if out in g.outputs:
        return f"{describe_tensor(g, out)} is a program output"
    readers = g.users(out)
    if not readers:
        return f"nothing reads {describe_tensor(g, out)}"
    for r in readers:
        reason = _why_not_reader(g, out, r, meta.shape[1])
        if reason:
            return reason
    if writers_of(g, [meta.storage]):
        return f"{describe_tensor(g, out)} is written in place"
    before_cat: set[int] | None = None      # walked only where a piece is written in place
    for s, writers in writers_of(g, [g.tensors[t].storage for t in pieces]).items():
        for m in writers:
            if before_cat is None:
                before_cat = ancestors(g, cat)
            if m in before_cat:
                continue
            late = next((r for r in readers if m in ancestors(g, r)), None)
            if late is not None:
                t = next(t for t in pieces if g.tensors[t].storage == s)
                return (f"{describe_node(g, m)} writes {describe_tensor(g, t)} in place between "
                        f"{what} and {describe_node(g, late)}: the pieces would be read changed")
    backward = tuple(r for r in readers if g.nodes[r].op == CONV_BACKWARD)
    for b in backward:
        grad_in = g.nodes[b].outputs[0]
        if grad_in is not None and writers_of(g, [g.tensors[grad_in].storage]):
            return (f"the input gradient of {describe_node(g, b)} is written in place: its readers would "
                    "not see the write in the pieces' gradients")
    forward = tuple(r for r in readers if g.nodes[r].op == CONV)
    return ConvCat(cat, pieces, sizes, forward, backward)


def why_not_split_conv_cat(g: Graph, order: Sequence[int], cat: int, *, checked: bool = False) -> str | None:
    """Why split_conv_cat does not apply at the cat node `cat` (None when it does)."""
    plan = plan_conv_cat(g, order, cat, checked=checked)
    return plan if isinstance(plan, str) else None


def _weight_pieces(edit: Edit, plan: ConvCat, node: Node, weight: int, label: str) -> list[int]:
    wdim = _weight_dim(node)
    return [edit.add(SLICE, (TensorRef(weight), wdim, a, b), name=f"{label}_weight{i}", phase=node.phase,
                     module=node.module).output_tuple[0]
            for i, (a, b) in enumerate(plan.bounds())]


def _split_forward(g: Graph, order: Sequence[int], plan: ConvCat, nid: int) -> Rewrite:
    """The convolution `nid` over the concatenation: one per piece, summed into its result."""
    node = g.nodes[nid]
    label = node.name or str(nid)
    edit = Edit(g, order, RULE)
    weight, bias = node.args[_CONV_WEIGHT], node.args[2]
    if not isinstance(weight, TensorRef):
        raise RuleError(f"internal: {describe_node(g, nid)} changed")
    weights = _weight_pieces(edit, plan, node, weight.id, label)
    result = node.output_ids()[0]
    total: int | None = None
    last: Node | None = None
    for i, (x, w) in enumerate(zip(plan.pieces, weights, strict=True)):
        args = (TensorRef(x), TensorRef(w), bias if i == 0 else None, *node.args[3:])
        part = edit.add(CONV, args, name=f"{label}_cat{i}", phase=node.phase, module=node.module,
                        tag=TasoTag(RULE, part=i, part_of=label)).output_tuple[0]
        if total is None:
            total = part
            continue
        final = i == len(plan.pieces) - 1
        last = edit.add(ADD, (TensorRef(total), TensorRef(part)), name=f"{label}_sum{i}", phase=node.phase,
                        module=node.module, outputs=[result] if final else None)
        total = last.output_tuple[0]
    if last is None:
        raise RuleError(f"internal: {describe_node(g, plan.cat)} has one piece")
    edit.remove(nid, stand_ins=(last.id,), handed_on=(result,))
    edit.inherit.update({a: (nid,) for a in edit.added})
    edit.remove_dead([plan.cat])
    return edit.finish([nid], f"{describe_node(g, nid)} runs as {len(plan.pieces)} convolutions, one per "
                              f"tensor {describe_node(g, plan.cat)} concatenated, summed")


def input_gradient_readers(g: Graph, backward: int, plan: ConvCat) -> tuple[dict[int, int], bool]:
    """The readers of the backward's whole input gradient that slice out exactly one piece's
    channels (reader -> piece), and whether anything else reads it (or it is a program output)."""
    grad_in = g.nodes[backward].outputs[0]
    if grad_in is None:
        return {}, False
    sliced: dict[int, int] = {}
    others = grad_in in g.outputs
    for r in g.users(grad_in):
        i = _slice_piece(g, r, grad_in, plan.bounds())
        if i is None:
            others = True
        else:
            sliced[r] = i
    return sliced, others


def _slice_piece(g: Graph, reader: int, grad: int, bounds: Sequence[tuple[int, int]]) -> int | None:
    """Which piece's channels the reader of the whole input gradient `grad` slices out exactly
    (None for any other reader)."""
    node = g.nodes[reader]
    if node.op != SLICE or node.kwargs or len(node.args) < 4 or _arg(node, 4, 1) != 1:
        return None
    ref, dim, start, stop = node.args[:4]
    shape = g.tensors[grad].shape
    if not isinstance(ref, TensorRef) or ref.id != grad or not isinstance(dim, int) or dim % len(shape) != 1:
        return None
    if not isinstance(start, int) or not isinstance(stop, int) or any(t in g.outputs for t in node.output_ids()):
        return None
    channels = shape[1]
    start, stop = (max(0, min(channels, v + channels if v < 0 else v)) for v in (start, stop))
    return next((i for i, b in enumerate(bounds) if b == (start, stop)), None)


def _split_backward(g: Graph, order: Sequence[int], plan: ConvCat, nid: int) -> Rewrite:
    """The convolution backward `nid` reading the concatenation: one per piece (module doc)."""
    node = g.nodes[nid]
    label = node.name or str(nid)
    edit = Edit(g, order, RULE)
    weight, mask = node.args[_BW_WEIGHT], conv_backward_mask(node.args)
    if not isinstance(weight, TensorRef) or mask is None:
        raise RuleError(f"internal: {describe_node(g, nid)} changed")
    grad_in, grad_w, grad_b = (list(node.outputs) + [None, None, None])[:3]
    sliced, others = input_gradient_readers(g, nid, plan)
    weights = _weight_pieces(edit, plan, node, weight.id, label)
    made: list[Node] = []
    grads: list[int | None] = []
    weight_grads: list[int] = []
    # pieces whose gradient something reads (autograd slices out the image's channels too)
    read = {i for r, i in sliced.items() if g.users(g.nodes[r].output_ids()[0])}
    for i, (x, w) in enumerate(zip(plan.pieces, weights, strict=True)):
        wanted = grad_in is not None and (others or i in read)
        piece_mask = [mask[0] and wanted, mask[1], mask[2] and i == 0]
        if not any(piece_mask):
            grads.append(None)
            continue
        args = (node.args[_BW_GRAD], TensorRef(x), TensorRef(w), *node.args[3:_BW_MASK], piece_mask)
        part = edit.add(CONV_BACKWARD, args, name=f"{label}_cat{i}", phase=node.phase, module=node.module,
                        tag=TasoTag(RULE, part=i, part_of=label), multi_output=True,
                        outputs=[None, None, grad_b if piece_mask[2] and grad_b is not None else None])
        made.append(part)
        grads.append(part.outputs[0] if piece_mask[0] else None)
        if piece_mask[1] and part.outputs[1] is not None:
            weight_grads.append(part.outputs[1])
    handed: list[int] = [grad_b] if grad_b is not None and mask[2] else []
    if grad_w is not None:
        cat_w = edit.add(CAT, ([TensorRef(t) for t in weight_grads], _weight_dim(node)), name=f"{label}_grad_weight",
                         phase=node.phase, module=node.module, outputs=[grad_w])
        made.append(cat_w)
        handed.append(grad_w)
    if grad_in is not None:
        if others:     # a reader of the whole input gradient: it reads the pieces' cat
            whole = edit.add(CAT, ([TensorRef(t) for t in grads if t is not None], 1), name=f"{label}_grad_input",
                             phase=node.phase, module=node.module, outputs=[grad_in])
            made.append(whole)
            handed.append(grad_in)
        mapping = {}
        for r, i in sliced.items():
            piece = grads[i]
            if i in read and piece is None:
                raise RuleError(f"internal: no gradient made for piece {i} of {describe_node(g, plan.cat)}")
            if piece is not None:
                mapping[g.nodes[r].output_ids()[0]] = piece
        edit.rederive(edit.redirect(mapping))
        for r in sliced:
            edit.remove(r, stand_ins=tuple(m.id for m in made))
    edit.remove(nid, stand_ins=tuple(m.id for m in made), handed_on=handed)
    edit.inherit.update({a: (nid,) for a in edit.added})
    edit.remove_dead([plan.cat])
    return edit.finish([nid], f"{describe_node(g, nid)} runs as {len(made)} node(s), one backward per tensor "
                              f"{describe_node(g, plan.cat)} concatenated")


def split_conv_cat(g: Graph, order: Sequence[int], cats: Sequence[int]) -> Rewrite:
    """Every convolution and convolution backward reading the concatenations `cats` (cat
    nodes; other nodes listed are left out) runs per concatenated tensor (module doc); the cats
    go. Raises RuleError (the reason of why_not_split_conv_cat) where the rule does not apply."""
    cats = [c for c in cats if c not in g.nodes or g.nodes[c].op == CAT]
    steps: list[Rewrite] = []
    h, o = g, list(order)
    for cat in cats:
        plan = plan_conv_cat(h, o, cat)
        if isinstance(plan, str):
            raise RuleError(plan)
        for nid in (*plan.forward, *plan.backward):
            rw = (_split_forward if nid in plan.forward else _split_backward)(h, o, plan, nid)
            steps.append(rw)
            h, o = rw.graph, rw.order
    if not steps:
        raise RuleError("no concatenation to split")
    return compose_rewrites(g, steps, f"split the convolutions over {len(cats)} concatenation(s) "
                                      f"({', '.join(g.nodes[c].name or str(c) for c in cats)}) per concatenated tensor")


def conv_cat_sites(g: Graph, order: Sequence[int]) -> list[ConvCat]:
    """Every concatenation the rule applies to, most bytes first (then capture order)."""
    found = []
    for nid in g.order:
        if g.nodes[nid].op != CAT:
            continue
        plan = plan_conv_cat(g, order, nid, checked=True)
        if not isinstance(plan, str):
            found.append(plan)
    return sorted(found, key=lambda p: -g.tensors[g.nodes[p.cat].output_ids()[0]].nbytes)
