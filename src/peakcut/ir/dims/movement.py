"""Rules of data-movement ops: concatenation, padding, gathers and scatters, indexing,
embeddings, pooling and upsampling, losses, slice/select backwards, sorting.

The axis an op moves data along (concatenated, padded, gathered, pooled,
sorted, flipped, ...) is None; the axes it carries through are labels. Index
tensors are sliced along their own axes where the output follows them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peakcut.ir.dims.call import Builder, Call, Labeling, aten
from peakcut.ir.dims.rule import Dims, Label
from peakcut.ir.dims.shapes import (
    Shape,
    broadcast,
    broadcast_shapes,
    cut,
    names,
    norm_dim,
    norm_dims,
    without,
)
from peakcut.ir.node import TensorRef

_SUM = "sum"


# ------------------------------------------------------------------ cat, stack, pad, repeat
def cat(call: Call) -> Labeling:
    """cat: the concatenated axis is None (legacy 1-d empty inputs are skipped by cat)."""
    out = names(len(call.out))
    dim = norm_dim(call.arg("dim"), len(out))
    dims = cut(out, dim)
    entries = [dims if s is not None and len(s) == len(out) else None
               for s in call.list_shapes("tensors")]
    return Labeling({"tensors": entries}, [dims])


def stack(call: Call) -> Labeling:
    out = names(len(call.out))
    dim = norm_dim(call.arg("dim"), len(out))
    src = without(out, [dim])
    return Labeling({"tensors": [src] * len(call.arg("tensors"))}, [cut(out, dim)])


def constant_pad_nd(call: Call) -> Labeling:
    """constant_pad_nd: padded (or cropped) axes are None; pad pairs count from the last axis."""
    out = names(len(call.out))
    pad: list[int] = list(call.arg("pad"))
    touched = [len(out) - 1 - i // 2 for i, p in enumerate(pad) if p != 0]
    dims = cut(out, *touched)
    return Labeling({"self": dims}, [dims])


def repeat(call: Call) -> Labeling:
    """repeat: an axis repeated r > 1 times is an output label tied to its `repeats` entry
    (part p holds r/n whole copies); an axis repeated once is shared with the input."""
    repeats: list[int] = list(call.arg("repeats"))
    src_rank = len(call.shape("self"))
    offset = len(repeats) - src_rank
    out: list[Label] = []
    src: list[Label | None] = [None] * src_rank
    sizes: list[Label | None] = []
    for j, r in enumerate(repeats):
        if r == 1 and j >= offset:
            out.append(f"d{j}")
            src[j - offset] = f"d{j}"
            sizes.append(None)
        else:
            out.append(f"r{j}")
            sizes.append(f"r{j}")
    return Labeling({"self": tuple(src)}, [tuple(out)], sizes={"repeats": tuple(sizes)})


def leading(k: int, *tensor_args: str, size_args: tuple[str, ...] = ()) -> Builder:
    """Ops acting on the last `k` axes (pooling, upsampling, 2-d padding, and backwards):
    every leading axis (batch, channel) is a label of the named tensors, the outputs and
    the entries of `size_args` that describe a full input shape."""

    def build(call: Call) -> Labeling:
        rank = len(call.out)
        dims = names(rank - k) + (None,) * k
        sizes = {name: dims for name in size_args}
        return Labeling(dict.fromkeys(tensor_args, dims), [dims] * len(call.outputs), sizes=sizes)

    return build


def im2col(call: Call) -> Labeling:
    """im2col [N, C, H, W] -> [N, C*kh*kw, L]: batch and channel (the outer part of C*kh*kw)."""
    lead = names(len(call.shape("self")) - 2)
    return Labeling({"self": lead + (None, None)}, [lead + (None,)])


def col2im(call: Call) -> Labeling:
    """col2im [N, C*kh*kw, L] -> [N, C, H, W]: batch and channel."""
    lead = names(len(call.out) - 2)
    return Labeling({"self": lead + (None,)}, [lead + (None, None)])


# ------------------------------------------------------------------ gathers and scatters
def gather(call: Call) -> Labeling:
    """gather: out[..i..] = self[..index[..i..]..] along `dim`.

    Along `dim` the index and output are sliced together (self stays whole);
    along other axes self joins them when it has the index's length.
    """
    index = call.shape("index")
    src = call.shape("self")
    out = names(len(index))
    dim = norm_dim(call.arg("dim"), len(out)) if out else 0
    same = [i for i in range(len(out)) if i == dim or src[i] == index[i]]
    dims = tuple(d if i in same else None for i, d in enumerate(out))
    return Labeling({"index": dims, "self": cut(dims, dim)}, [dims])


def scatter(call: Call) -> Labeling:
    """scatter(.src/.value), scatter_add, scatter_reduce: axes other than `dim` where self,
    index and src have one length are labels; `dim` (written at data-dependent rows) is None."""
    out = names(len(call.out))
    dim = norm_dim(call.arg("dim"), len(out)) if out else 0
    shapes = [s for s in map(call.optional_shape, ("self", "index", "src")) if s is not None]
    keep = [i for i in range(len(out)) if i != dim and len({s[i] for s in shapes}) == 1]
    dims = tuple(d if i in keep else None for i, d in enumerate(out))
    return Labeling({"self": dims, "index": dims, "src": dims}, [dims])


def _advanced_index(call: Call) -> tuple[list[int], Shape, bool] | None:
    """(indexed axes, broadcast index shape, whether the index axes stay in place) of
    self[indices]; None for boolean masks (data-dependent shapes)."""
    values: Sequence[TensorRef | None] = call.arg("indices")
    if any(call.dtypes[v.id] in (torch.bool, torch.uint8) for v in values if v is not None):
        return None
    axes = [i for i, v in enumerate(values) if v is not None]
    shape = broadcast_shapes([s for s in call.list_shapes("indices") if s is not None])
    in_place = axes == list(range(axes[0], axes[0] + len(axes))) if axes else True
    return axes, shape, in_place


def _index_result(self_shape: Shape, axes: list[int], index_shape: Shape,
                  index_dims: Dims, in_place: bool) -> tuple[Dims, Shape]:
    """(labels, shape) of self[indices]: self's other axes (labelled d_i) around the index
    axes when those are adjacent, else after them."""
    rest = [i for i in range(len(self_shape)) if i not in axes]
    split = axes[0] if in_place and axes else 0
    before, after = [i for i in rest if i < split], [i for i in rest if i >= split]
    dims = (*(f"d{i}" for i in before), *index_dims, *(f"d{i}" for i in after))
    shape = (*(self_shape[i] for i in before), *index_shape, *(self_shape[i] for i in after))
    return dims, shape


def index(call: Call) -> Labeling | None:
    """index.Tensor (advanced indexing with integer index tensors): the index tensors'
    broadcast axes and self's other axes are labels; indexed axes of self are None."""
    found = _advanced_index(call)
    if found is None:
        return None
    axes, shape, in_place = found
    self_shape = call.shape("self")
    index_dims = names(len(shape), "i")
    out, out_shape = _index_result(self_shape, axes, shape, index_dims, in_place)
    if out_shape != call.out:
        return None
    src = tuple(None if i in axes else f"d{i}" for i in range(len(self_shape)))
    entries = [broadcast(s, shape, index_dims) for s in call.list_shapes("indices")]
    return Labeling({"self": src, "indices": entries}, [out])


def index_put(call: Call) -> Labeling | None:
    """index_put(_): self's axes that are not indexed are labels (of self, values and the
    output); the index tensors are shared."""
    found = _advanced_index(call)
    if found is None:
        return None
    axes, shape, in_place = found
    self_shape = call.shape("self")
    src = tuple(None if i in axes else f"d{i}" for i in range(len(self_shape)))
    target, target_shape = _index_result(self_shape, axes, shape, (None,) * len(shape), in_place)
    values = broadcast(call.optional_shape("values"), target_shape, target)
    return Labeling({"self": src, "values": values}, [src])


def index_select(call: Call) -> Labeling:
    """index_select: the index's axis replaces `dim` in the output; other axes are labels."""
    rank = len(call.shape("self"))
    dim = norm_dim(call.arg("dim"), rank)
    src = cut(names(rank), dim)
    out = tuple("i" if i == dim else d for i, d in enumerate(src))
    idx = ("i",) if len(call.shape("index")) == 1 else ()
    return Labeling({"self": src, "index": idx}, [out])


def index_add(call: Call) -> Labeling:
    """index_add(_): self's axes other than `dim` are labels of self, source and the output;
    `dim` (rows added at data-dependent positions), source's index axis and the index stay whole."""
    rank = len(call.shape("self"))
    dim = norm_dim(call.arg("dim"), rank) if rank else 0
    dims = cut(names(rank), dim)
    source = dims if len(call.shape("source")) == rank else (None,) * len(call.shape("source"))
    return Labeling({"self": dims, "source": source, "index": (None,) * len(call.shape("index"))}, [dims])


def embedding(call: Call) -> Labeling:
    """embedding(weight [V, D], indices) -> indices.shape + [D]: index axes and D."""
    idx = names(len(call.shape("indices")), "i")
    return Labeling({"weight": (None, "e"), "indices": idx}, [idx + ("e",)])


def embedding_dense_backward(call: Call) -> Labeling:
    """embedding_dense_backward -> [V, D]: D spatial; the index axes are summed over, unless
    scale_grad_by_freq (the scale counts each index over the whole batch)."""
    idx: Dims = names(len(call.shape("indices")), "i")
    if call.arg("scale_grad_by_freq"):
        idx = (None,) * len(idx)
    merge = {d: _SUM for d in idx if d is not None}
    return Labeling({"grad_output": idx + ("e",), "indices": idx}, [(None, "e")], merge=merge)


# ------------------------------------------------------------------ slicing backwards, scatters
def slice_backward(call: Call) -> Labeling:
    """slice_backward: zeros(input_sizes) with grad_output written into a slice of `dim`."""
    sizes: list[int] = list(call.arg("input_sizes"))
    out = names(len(sizes))
    dim = norm_dim(call.arg("dim"), len(out))
    dims = out if call.shape("grad_output")[dim] == sizes[dim] else cut(out, dim)
    return Labeling({"grad_output": dims}, [dims], sizes={"input_sizes": dims})


def select_backward(call: Call) -> Labeling:
    sizes: list[int] = list(call.arg("input_sizes"))
    out = names(len(sizes))
    dim = norm_dim(call.arg("dim"), len(out))
    dims = cut(out, dim)
    return Labeling({"grad_output": without(out, [dim])}, [dims], sizes={"input_sizes": dims})


def select_scatter(call: Call) -> Labeling:
    out = names(len(call.out))
    dim = norm_dim(call.arg("dim"), len(out))
    return Labeling({"self": cut(out, dim), "src": without(out, [dim])}, [cut(out, dim)])


def slice_scatter(call: Call) -> Labeling:
    out = names(len(call.out))
    dim = norm_dim(call.arg("dim"), len(out))
    dims = out if call.shape("src")[dim] == call.out[dim] else cut(out, dim)
    return Labeling({"self": dims, "src": dims}, [dims])


# ------------------------------------------------------------------ reorderings
def flip(call: Call) -> Labeling:
    out = names(len(call.out))
    dims = cut(out, *norm_dims(call.arg("dims"), len(out))) if call.arg("dims") else out
    return Labeling({"self": dims}, [dims])


def roll(call: Call) -> Labeling:
    """roll: rolled axes are None; without `dims` the flattened tensor rolls (all None)."""
    out = names(len(call.out))
    rolled = norm_dims(call.arg("dims"), len(out)) if call.arg("dims") else range(len(out))
    dims = cut(out, *rolled)
    return Labeling({"self": dims}, [dims])


def along_dim(call: Call) -> Labeling:
    """sort, topk -> (values, indices): the sorted axis is None."""
    out = names(len(call.out))
    dims = cut(out, norm_dim(call.arg("dim"), len(out))) if out else ()
    return Labeling({"self": dims}, [dims, dims])


# ------------------------------------------------------------------ losses
_MEAN, _SUM_REDUCTION = 1, 2


def nll_loss(call: Call) -> Labeling:
    """nll_loss(2d)_forward -> (output, total_weight): every axis of self but the class axis
    (1) is a label. reduction none: output keeps them, total_weight (0) is "same"; sum:
    both outputs sum; mean: "nll_mean" (parts run as sums; output = sum / total_weight)."""
    x = call.shape("self")
    if len(x) < 2:
        return Labeling({}, [(), ()])
    dims = ("n", None, *names(len(x) - 2, "s"))
    target = without(dims, [1])
    reduction: int = call.arg("reduction")
    if reduction not in (_MEAN, _SUM_REDUCTION):
        return Labeling({"self": dims, "target": target}, [target, ()])
    kind = "nll_mean" if reduction == _MEAN else _SUM
    return Labeling({"self": dims, "target": target}, [(), ()],
                    merge={d: kind for d in target if d is not None})


def nll_loss_backward(call: Call) -> Labeling:
    """nll_loss(2d)_backward: grad_input follows self; total_weight and a reduced
    grad_output are 0-d and shared (the whole batch's weight, as the forward computed it)."""
    x = call.shape("self")
    if len(x) < 2:
        return Labeling({}, [(None,) * len(x)])
    dims = ("n", None, *names(len(x) - 2, "s"))
    target = without(dims, [1])
    grad = target if len(call.shape("grad_output")) == len(target) else ()
    return Labeling({"self": dims, "target": target, "grad_output": grad}, [dims])


BUILDERS: dict[str, Builder] = {
    aten("cat"): cat,
    aten("stack"): stack,
    aten("constant_pad_nd"): constant_pad_nd,
    aten("repeat"): repeat,
    aten("gather"): gather,
    aten("scatter.src"): scatter,
    aten("scatter.value"): scatter,
    aten("scatter_add"): scatter,
    aten("scatter_reduce.two"): scatter,
    aten("index.Tensor"): index,
    aten("index_put"): index_put,
    aten("index_put_"): index_put,
    aten("index_select"): index_select,
    aten("index_add"): index_add,
    aten("index_add_"): index_add,
    aten("embedding"): embedding,
    aten("embedding_dense_backward"): embedding_dense_backward,
    aten("max_pool2d_with_indices"): leading(2, "self"),
    aten("max_pool2d_with_indices_backward"): leading(2, "grad_output", "self", "indices"),
    aten("avg_pool2d"): leading(2, "self"),
    aten("avg_pool2d_backward"): leading(2, "grad_output", "self"),
    aten("_adaptive_avg_pool2d"): leading(2, "self"),
    aten("_adaptive_avg_pool2d_backward"): leading(2, "grad_output", "self"),
    aten("upsample_nearest2d.vec"): leading(2, "input"),
    aten("upsample_bilinear2d.vec"): leading(2, "input"),
    aten("upsample_nearest2d_backward"): leading(2, "grad_output", size_args=("input_size",)),
    aten("upsample_bilinear2d_backward"): leading(2, "grad_output", size_args=("input_size",)),
    aten("reflection_pad2d"): leading(2, "self"),
    aten("replication_pad2d"): leading(2, "self"),
    aten("im2col"): im2col,
    aten("col2im"): col2im,
    aten("nll_loss_forward"): nll_loss,
    aten("nll_loss2d_forward"): nll_loss,
    aten("nll_loss_backward"): nll_loss_backward,
    aten("nll_loss2d_backward"): nll_loss_backward,
    aten("slice_backward"): slice_backward,
    aten("select_backward"): select_backward,
    aten("select_scatter"): select_scatter,
    aten("slice_scatter"): slice_scatter,
    aten("flip"): flip,
    aten("roll"): roll,
    aten("sort"): along_dim,
    aten("topk"): along_dim,
}
