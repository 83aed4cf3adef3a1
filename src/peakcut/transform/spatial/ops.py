"""What a spatial region may hold: which ops split along the rows of their images, and the
rows each reads.

    why_not_node(g, v)       # None: node v can be in a region; else why not, naming it
    conv_window(g, node, ..) # a convolution's geometry along the height (Window)
    owned(height, k, n)      # the rows part k of n owns

Ops: 2-D convolutions and their backwards (not transposed), element-wise ops on [N, C, H, W]
images, a softmax along another dim than the rows, a detach, and a per-pixel nll_loss2d
(unweighted, mean or sum). The package doc of peakcut.transform.spatial says how each splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.registry import (
    CONV,
    CONV_BACKWARD,
    OpKind,
    conv_backward_mask,
    draws_random,
    lookup,
)
from peakcut.ir.tensor import Role, contiguous_strides
from peakcut.transform.rewrite import describe_node, describe_tensor

__all__ = [
    "CONV", "CONV_BACKWARD", "NLL_BACKWARD", "NLL_FORWARD", "REDUCTION_MEAN", "REDUCTION_SUM",
    "ROWS", "ROW_LOCAL_VIEWS", "Rows", "SOFTMAX_DIM_ARG", "TARGET_ROWS", "Window", "conv_window",
    "is_pointwise", "owned", "reads_grad_input_inside", "reads_input_shape_only", "split_inputs",
    "why_not_node", "with_height_padding",
]

ROWS = 2                                   # the height dimension of NCHW
NLL_FORWARD = "aten.nll_loss2d_forward.default"
NLL_BACKWARD = "aten.nll_loss2d_backward.default"
TARGET_ROWS = 1                            # the height dimension of an [N, H, W] target
REDUCTION_MEAN, REDUCTION_SUM = 1, 2      # ATen's reduction enum
# Ops that make each output row from the same rows of their inputs, beyond the element-wise
# kind: views of the same shape (a detach), and a softmax along another dim than the rows
# (the position of its dim argument).
ROW_LOCAL_VIEWS = ("aten.detach.default", "aten.alias.default")
SOFTMAX_DIM_ARG = {"aten._log_softmax.default": 1, "aten._softmax.default": 1,
                   "aten._log_softmax_backward_data.default": 2, "aten._softmax_backward_data.default": 2}


@dataclass(frozen=True)
class Rows:
    """Rows [start, stop) of an image; start may be negative and stop past the height where a
    window reaches into the padding."""

    start: int
    stop: int

    def hull(self, other: Rows | None) -> Rows:
        return self if other is None else Rows(min(self.start, other.start), max(self.stop, other.stop))

    def clip(self, height: int) -> Rows:
        return Rows(max(0, self.start), min(height, self.stop))

    def __len__(self) -> int:
        return max(0, self.stop - self.start)


def owned(height: int, k: int, n: int) -> Rows:
    """The rows part k of n owns of a tensor of `height` rows."""
    return Rows(k * height // n, (k + 1) * height // n)


@dataclass(frozen=True)
class Window:
    """A 2-D convolution's geometry along the height."""

    stride: int
    padding: int
    dilation: int
    kernel: int

    def reads(self, rows: Rows) -> Rows:
        """The input rows (unclipped) that output rows `rows` read."""
        first = rows.start * self.stride - self.padding
        return Rows(first, (rows.stop - 1) * self.stride - self.padding + self.dilation * (self.kernel - 1) + 1)


def _int_list(value: Any, n: int = 2) -> list[int]:
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * n


def conv_window(g: Graph, n: Node, weight_arg: int, first: int) -> Window | str:
    """The height geometry of a convolution (forward args from `first` = stride), or why none."""
    weight = n.args[weight_arg]
    if not isinstance(weight, TensorRef) or len(g.tensors[weight.id].shape) != 4:
        return f"{describe_node(g, n.id)} is not a 2-D convolution"
    stride, padding, dilation = (_int_list(n.args[first + i]) for i in range(3))
    if n.args[first + 3]:
        return f"{describe_node(g, n.id)} is a transposed convolution: its rows are not split"
    return Window(stride[0], padding[0], dilation[0], g.tensors[weight.id].shape[2])


def with_height_padding(value: Any) -> list[int]:
    padding = _int_list(value)
    return [0, *padding[1:]]


def split_inputs(g: Graph, n: Node) -> list[int] | str:
    """The tensor inputs of an element-wise node split along its rows (the others broadcast),
    or why it cannot be split."""
    (out,) = n.output_ids()
    shape = g.tensors[out].shape
    if len(shape) != 4:
        return f"{describe_node(g, n.id)} makes a rank-{len(shape)} tensor: only [N, C, H, W] images are split"
    split = []
    for t in n.input_ids():
        s = g.tensors[t].shape
        if len(s) == 4 and s[ROWS] == shape[ROWS]:
            split.append(t)
        elif not (len(s) == 4 and s[ROWS] == 1) and g.tensors[t].numel > 1:
            return (f"{describe_node(g, n.id)} reads {describe_tensor(g, t)} of shape {list(s)}, "
                    "which broadcasts along the rows in a way the split does not follow")
    return split


def why_not_node(g: Graph, v: int) -> str | None:
    """Why node `v` cannot be in a spatial region (None: it can)."""
    n = g.nodes[v]
    what = describe_node(g, v)
    if n.op == CONV:
        x = n.args[0]
        if not isinstance(x, TensorRef) or len(g.tensors[x.id].shape) != 4:
            return f"{what} does not read a 4-D image"
        w = conv_window(g, n, 1, 3)
        return w if isinstance(w, str) else None
    if n.op == CONV_BACKWARD:
        w = conv_window(g, n, 2, 4)
        return w if isinstance(w, str) else None
    if n.op in (NLL_FORWARD, NLL_BACKWARD):
        return _why_not_nll(g, n)
    info = lookup(n.op)
    if n.op in SOFTMAX_DIM_ARG:
        dim = n.args[SOFTMAX_DIM_ARG[n.op]]
        if not isinstance(dim, int) or dim % 4 == ROWS:
            return f"{what} takes its softmax along the rows: its parts would see only their own"
    elif n.op in ROW_LOCAL_VIEWS:
        viewed = [t for t in n.input_ids() if g.tensors[t].role not in (Role.ACTIVATION, Role.INPUT)]
        if viewed:
            return (f"{what} views {describe_tensor(g, viewed[0])}, a {g.tensors[viewed[0]].role.value} "
                    "tensor, not an image the step computes")
    elif info is None or info.kind is not OpKind.ELEMENTWISE:
        return (f"{what} is neither a convolution, its backward, an element-wise op, a softmax "
                "along the channels nor a per-pixel loss: spatial fission does not split it")
    if draws_random(n.op, n.args, n.kwargs):
        return f"{what} draws random numbers: its parts would draw other numbers"
    if n.mutated_ids():
        return f"{what} writes a tensor in place"
    if len(n.output_ids()) != 1:
        return f"{what} has {len(n.output_ids())} outputs"
    reason = split_inputs(g, n)
    return reason if isinstance(reason, str) else None


def _why_not_nll(g: Graph, n: Node) -> str | None:
    """Why a per-pixel nll_loss2d (forward or backward) cannot be in a spatial region."""
    what = describe_node(g, n.id)
    first = 1 if n.op == NLL_BACKWARD else 0
    x, target, weight, reduction = n.args[first:first + 4]
    if not isinstance(x, TensorRef) or not isinstance(target, TensorRef) or len(g.tensors[x.id].shape) != 4:
        return f"{what} does not read [N, C, H, W] scores and an [N, H, W] target"
    if weight is not None:
        return f"{what} weighs its classes: its parts' total weights are not split here"
    if reduction not in (REDUCTION_MEAN, REDUCTION_SUM):
        return f"{what} has reduction {reduction!r}: only mean and sum are split"
    if n.op == NLL_BACKWARD and not (isinstance(n.args[0], TensorRef) and g.tensors[n.args[0].id].numel == 1):
        return f"{what} reads a grad_output that is not a scalar"
    return None


def is_pointwise(g: Graph, node: Node) -> bool:
    """A convolution's backward whose grad_input rows are its grad_output rows (kernel 1 along
    the height, stride 1, no padding): a part's grad_input rows are exact, not partial sums,
    so the region may read them."""
    w = conv_window(g, node, 2, 4)
    return isinstance(w, Window) and w.stride == 1 and w.padding == 0 and w.dilation * (w.kernel - 1) == 0


def reads_grad_input_inside(g: Graph, node: Node, inside: set[int]) -> bool:
    """Whether a pointwise convolution's backward (is_pointwise) hands its grad_input rows to
    a reader in the region."""
    gi = node.outputs[0]
    return gi is not None and is_pointwise(g, node) and any(u in inside for u in g.users(gi))


def reads_input_shape_only(g: Graph, node: Node) -> bool:
    """A backward that makes only grad_input reads its input's shape, never its values (ATen
    passes `input.sizes()` to every backend's backward-data); it still makes the input
    contiguous first, so a row slice of it would be copied whole for nothing."""
    x = node.args[1] if len(node.args) > 1 else None
    if conv_backward_mask(node.args) != (True, False, False) or not isinstance(x, TensorRef):
        return False
    meta = g.tensors[x.id]
    return meta.stride == contiguous_strides(meta.shape)
