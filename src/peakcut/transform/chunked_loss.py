"""A language model's head and loss (peakcut.transform.head_loss) run in chunks of the
sequence: for each chunk of the positions the loss reads, the projection of that chunk's
hidden rows, the log-softmax, the chunk's loss (summed), and at once the chunk's gradient
(the loss's backward, the log-softmax's, the projection's: the weight's gradient added up over
the chunks, the hidden rows' gradient kept per chunk). The batch x sequence x vocabulary
logits, log-probabilities and their gradients are never whole: one chunk's are at a time.

The numbers are eager's within rounding: every element-wise step (the scale, the casts, the
log-softmax and its backward, the loss's gradient) runs on each row as eager runs it; the
count of targets a mean divides by is computed up front from all the targets (an integer,
exact in float32 below 2**24, what `nll_loss_forward` counts: ignore_index excluded); the sums
over rows are added chunk by chunk: the loss in float32, the weight's gradient in its own
dtype (`addmm` onto the chunks before: one rounding per chunk, and no buffer beyond the
gradient's own and one chunk's product). Rows the loss does not read (the shift's last
position) get a zero gradient, as `slice_backward` gives them.

The chunk's gradient runs where the loss's backward began, so it needs the loss's gradient
before the loss is known: a constant (peakcut.fission.loss.detach_loss's seed) or
`ones_like(loss)`, which becomes a constant one; a gradient that depends on the loss's value
is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase, TensorRef
from peakcut.ir.tensor import contiguous_strides, dtype_from_name
from peakcut.transform.head_loss import (
    LOG_SOFTMAX,
    LOG_SOFTMAX_BACKWARD,
    MEAN,
    MM,
    NLL,
    NLL_BACKWARD,
    SLICE,
    SLICE_BACKWARD,
    SUM,
    TO_COPY,
    HeadLoss,
    Step,
    find_head_loss,
)
from peakcut.transform.rewrite import Rewrite, RuleError, ancestors, describe_node
from peakcut.transform.taso.edit import Edit


def chunk_bounds(positions: int, chunks: int) -> list[tuple[int, int]]:
    """`positions` split into `chunks` contiguous parts of near-equal size (the first ones
    one larger)."""
    size, extra = divmod(positions, chunks)
    out, lo = [], 0
    for k in range(chunks):
        hi = lo + size + (1 if k < extra else 0)
        out.append((lo, hi))
        lo = hi
    return out


def _seed_is_one(g: Graph, h: HeadLoss) -> bool:
    p = g.producer(h.grad_output)
    if p is None or g.nodes[p].op != "aten.ones_like.default":
        return False
    arg = g.nodes[p].args[0]
    return isinstance(arg, TensorRef) and arg.id == g.nodes[h.loss].output_ids()[0]


def why_not_chunk(g: Graph, h: HeadLoss, chunks: int) -> str | None:
    """Why `h` cannot run in `chunks` chunks (None when it can)."""
    positions = h.end - h.start
    if chunks < 2:
        return f"{chunks} chunk(s): the loss runs in 2 or more"
    if chunks > positions:
        return f"{chunks} chunks of {positions} positions"
    p = g.producer(h.grad_output)
    if p is not None and not _seed_is_one(g, h) and (p == h.loss or h.loss in ancestors(g, p)):
        return (f"the loss's gradient ({describe_node(g, p)}) depends on the loss's value: the chunks "
                "compute it with the loss")
    return None


class _Builder:
    """Adds the chunks' nodes to an Edit (one phase and module per kind of node)."""

    def __init__(self, ed: Edit, g: Graph, h: HeadLoss) -> None:
        self.ed, self.g, self.h = ed, g, h
        name = g.nodes[h.loss].name or str(h.loss)
        self.fwd = {"phase": Phase.LOSS, "module": g.nodes[h.logits_mm].module}
        self.loss = {"phase": Phase.LOSS, "module": g.nodes[h.loss].module}
        self.bwd = {"phase": Phase.BACKWARD, "module": g.nodes[h.input_grad_mm].module}
        self.name = f"{name}_chunked"

    def add(self, op: str, args: tuple, where: dict[str, Any], kwargs: dict[str, Any] | None = None,
            multi: bool = False) -> list[int]:
        node = self.ed.add(op, args, kwargs, name=self.name, multi_output=multi, **where)
        return node.output_ids()

    def one(self, op: str, args: tuple, where: dict[str, Any], kwargs: dict[str, Any] | None = None) -> int:
        return self.add(op, args, where, kwargs)[0]

    def dtype(self, t: int) -> str:
        return self.ed.new.tensors[t].dtype

    def cast(self, t: int, dtype: str, where: dict[str, Any]) -> int:
        if self.dtype(t) == dtype:
            return t
        return self.one(TO_COPY, (TensorRef(t),), where, {"dtype": dtype_from_name(dtype)})

    def steps(self, t: int, steps: Sequence[Step], where: dict[str, Any]) -> int:
        for kind, value in steps:
            if kind == "cast":
                t = self.cast(t, str(value), where)
            else:
                op = "aten.mul.Tensor" if kind == "mul" else "aten.div.Tensor"
                t = self.one(op, (TensorRef(t), value), where)
        return t

    def view(self, t: int, shape: Sequence[int], where: dict[str, Any]) -> int:
        """t as `shape`, through a contiguous copy where its layout does not allow a view."""
        meta = self.ed.new.tensors[t]
        if meta.stride != contiguous_strides(meta.shape):
            t = self.one("aten.clone.default", (TensorRef(t),), where, {"memory_format": torch.contiguous_format})
        return self.one("aten.view.default", (TensorRef(t), list(shape)), where)

    def rows(self, t: int, length: int, lo: int, hi: int, where: dict[str, Any]) -> int:
        """The rows of t (batch x `length` positions, batch-major, flattened in dim 0) of
        positions [lo, hi), flattened."""
        batch = self.h.batch
        if batch == 1:
            return self.one(SLICE, (TensorRef(t), 0, lo, hi), where)
        rest = list(self.ed.new.tensors[t].shape[1:])
        grid = self.view(t, [batch, length, *rest], where)
        part = self.one(SLICE, (TensorRef(grid), 1, lo, hi), where)
        return self.view(part, [batch * (hi - lo), *rest], where)


def chunk_head_loss(g: Graph, order: Sequence[int], loss: int, chunks: int, label: str = "chunked_loss") -> Rewrite:
    """The head and loss of nll_loss_forward node `loss` run in `chunks` chunks of the
    sequence (module doc); RuleError says why not."""
    h = find_head_loss(g, loss)
    if isinstance(h, str):
        raise RuleError(h)
    why = why_not_chunk(g, h, chunks)
    if why is not None:
        raise RuleError(why)
    ed = Edit(g, order, label)
    b = _Builder(ed, g, h)
    lsm_dtype = g.tensors[g.nodes[loss].output_ids()[0]].dtype
    positions = h.end - h.start
    seed = h.grad_output
    if _seed_is_one(g, h):
        seed = b.one("aten.scalar_tensor.default", (1.0,), b.bwd, {"dtype": dtype_from_name(g.tensors[seed].dtype)})
    count: int | None = None
    if h.reduction == MEAN:
        counted = b.one("aten.ne.Scalar", (TensorRef(h.target), h.ignore_index), b.loss)
        # counted exactly (float32 holds every count of a step's targets), rounded to the
        # log-probabilities' dtype only where nll_loss_backward takes it, as eager's total weight
        count = b.one("aten.sum.dim_IntList", (TensorRef(counted), []), b.loss, {"dtype": torch.float32})
    weight = b.one("aten.t.default", (TensorRef(h.wt),), b.bwd)
    total: int | None = None
    acc: int | None = None
    parts: list[int] = []
    for lo, hi in chunk_bounds(positions, chunks):
        x = b.rows(h.x, h.positions, h.start + lo, h.start + hi, b.fwd)
        target = b.rows(h.target, positions, lo, hi, b.loss)
        z = b.steps(b.one(MM, (TensorRef(x), TensorRef(h.wt)), b.fwd), h.forward_steps, b.loss)
        lsm = b.one(LOG_SOFTMAX, (TensorRef(z), 1, False), b.loss)
        part_loss, part_count = b.add(NLL, (TensorRef(lsm), TensorRef(target), None, SUM, h.ignore_index), b.loss, multi=True)
        part_loss = b.cast(part_loss, "float32", b.loss)
        total = part_loss if total is None else b.one("aten.add.Tensor", (TensorRef(total), TensorRef(part_loss)), b.loss)
        divide_by = b.cast(count, lsm_dtype, b.bwd) if count is not None else part_count
        grad = b.one(NLL_BACKWARD, (TensorRef(seed), TensorRef(lsm), TensorRef(target), None, h.reduction,
                                    h.ignore_index, TensorRef(divide_by)), b.bwd)
        grad = b.one(LOG_SOFTMAX_BACKWARD, (TensorRef(grad), TensorRef(lsm), 1, dtype_from_name(b.dtype(lsm))), b.bwd)
        grad = b.steps(grad, h.backward_steps, b.bwd)
        pair = (x, grad) if h.weight_grad_transposed else (grad, x)
        # the weight's gradient adds up in float32 and is rounded once, as eager's one mm
        # accumulates in float32 (products of bf16 or fp16 operands are exact in float32)
        pair = (b.cast(pair[0], "float32", b.bwd), b.cast(pair[1], "float32", b.bwd))
        left = b.one("aten.t.default", (TensorRef(pair[0]),), b.bwd)
        operands = (TensorRef(left), TensorRef(pair[1]))
        acc = (b.one(MM, operands, b.bwd) if acc is None
               else b.one("aten.addmm.default", (TensorRef(acc), *operands), b.bwd))
        parts.append(b.one(MM, (TensorRef(grad), TensorRef(weight)), b.bwd))
    if total is None or acc is None:
        raise RuleError("no chunk")
    new_loss = total if count is None else b.one("aten.div.Tensor", (TensorRef(total), TensorRef(count)), b.loss)
    old_loss = g.nodes[loss].output_ids()[0]
    new_loss = b.cast(new_loss, g.tensors[old_loss].dtype, b.loss)
    old_wgrad = g.nodes[h.weight_grad_mm].output_ids()[0]
    new_wgrad = b.cast(acc, g.tensors[old_wgrad].dtype, b.bwd)
    old_xgrad = g.nodes[h.input_grad_mm].output_ids()[0]
    new_xgrad = _assemble(b, parts, g.tensors[old_xgrad].shape)
    ed.redirect({old_loss: new_loss, old_wgrad: new_wgrad, old_xgrad: new_xgrad})
    stand_ins = tuple(ed.new.producer(t) for t in (new_loss, new_wgrad, new_xgrad))
    feeders = [p for v in h.removed for t in g.nodes[v].input_ids() if (p := g.producer(t)) is not None]
    for v in reversed(h.removed):
        ed.remove(v, stand_ins=tuple(s for s in stand_ins if s is not None))
    ed.remove_dead([f for f in feeders if f not in h.removed])
    nll_bw = next(v for v in h.removed if g.nodes[v].op == NLL_BACKWARD)
    return ed.finish([loss, nll_bw], f"{label}: {describe_node(g, loss)}'s head and loss in {chunks} chunks "
                     f"of {positions} positions")


def _assemble(b: _Builder, parts: Sequence[int], shape: Sequence[int]) -> int:
    """The hidden rows' gradient (`shape`: rows x D) from the chunks' (batch x chunk rows
    each), zero at the positions the loss does not read (slice_backward, as eager fills them)."""
    h = b.h
    width = shape[-1]
    if h.batch == 1:
        pieces, grid, dim = list(parts), [h.positions, width], 0
    else:
        pieces = [b.view(p, [h.batch, b.ed.new.tensors[p].shape[0] // h.batch, width], b.bwd) for p in parts]
        grid, dim = [h.batch, h.positions, width], 1
    whole = b.one("aten.cat.default", ([TensorRef(p) for p in pieces], dim), b.bwd)
    if (h.start, h.end) != (0, h.positions):
        whole = b.one(SLICE_BACKWARD, (TensorRef(whole), grid, dim, h.start, h.end, 1), b.bwd)
    return whole if h.batch == 1 else b.view(whole, list(shape), b.bwd)


def find_chunkable(g: Graph) -> list[HeadLoss]:
    """The heads and losses of g that run in chunks (2 chunks at least), in capture order."""
    out = []
    for v in g.order:
        if g.nodes[v].op == NLL:
            h = find_head_loss(g, v)
            if not isinstance(h, str) and why_not_chunk(g, h, 2) is None:
                out.append(h)
    return out

