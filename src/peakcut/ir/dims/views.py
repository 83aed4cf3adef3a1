"""Rules of view ops: the output's dimensions are the input's, moved, merged or dropped.

Splitting a view gives views of the slices; merging concatenates them, so the
merged result is a copy with the view's values (code generation decides
whether to keep it a view).
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.dims.call import Builder, Call, Labeling
from peakcut.ir.dims.rule import Dims
from peakcut.ir.dims.shapes import (
    broadcast,
    cut,
    names,
    norm_dim,
    norm_dims,
    reshape_links,
    without,
)


def identity(call: Call) -> Labeling:
    """alias, detach: output = input."""
    dims = names(len(call.out))
    return Labeling({"self": dims}, [dims])


def reshape(call: Call) -> Labeling:
    """view, _unsafe_view: outermost dimensions of equal-size blocks correspond."""
    src, dst = call.shape("self"), call.out
    in_dims: list[str | None] = [None] * len(src)
    out_dims: list[str | None] = [None] * len(dst)
    for k, (i, j) in enumerate(reshape_links(src, dst)):
        in_dims[i] = out_dims[j] = f"v{k}"
    return Labeling({"self": tuple(in_dims)}, [tuple(out_dims)],
                    sizes={"size": _size_labels(call.arg("size"), tuple(out_dims))})


def expand(call: Call) -> Labeling:
    """expand: broadcast input dims get None; new and kept dims are labels, tied to their
    size entries."""
    out = names(len(call.out))
    return Labeling({"self": broadcast(call.optional_shape("self"), call.out, out)}, [out],
                    sizes={"size": _size_labels(call.arg("size"), out)})


def _size_labels(size: Sequence[int], dims: Dims) -> Dims:
    """Labels of a size list's entries: the output dims', None for -1 (inferred: left alone)."""
    return tuple(None if s == -1 else d for s, d in zip(size, dims, strict=True))


def permute(call: Call) -> Labeling:
    dims = names(len(call.out))
    order = [norm_dim(d, len(dims)) for d in call.arg("dims")]
    return Labeling({"self": dims}, [tuple(dims[i] for i in order)])


def transpose(call: Call) -> Labeling:
    """transpose.int and t (t swaps dims 0 and 1 of a matrix, leaves vectors alone)."""
    dims = list(names(len(call.out)))
    if call.op == "aten.t.default":
        a, b = (0, 1) if len(dims) == 2 else (0, 0)
    else:
        a, b = norm_dim(call.arg("dim0"), len(dims)), norm_dim(call.arg("dim1"), len(dims))
    if dims:
        dims[a], dims[b] = dims[b], dims[a]
    return Labeling({"self": names(len(dims))}, [tuple(dims)])


def select(call: Call) -> Labeling:
    """select.int: the selected dimension goes away."""
    src = names(len(call.shape("self")))
    dim = norm_dim(call.arg("dim"), len(src))
    return Labeling({"self": cut(src, dim)}, [without(src, [dim])])


def slice_(call: Call) -> Labeling:
    """slice.Tensor, narrow: the sliced dimension keeps its label only when the slice is whole."""
    shape = call.shape("self")
    src = names(len(shape))
    dim = norm_dim(call.arg("dim"), len(src))
    dims = src if call.out[dim] == shape[dim] else cut(src, dim)
    return Labeling({"self": dims}, [dims])


def squeeze(call: Call) -> Labeling:
    """squeeze.default/.dim/.dims: size-1 dimensions named by `dim` (all by default) go away.

    A named dimension longer than 1 stays, but a part could cut it to length 1 and
    squeeze it: it is None. squeeze.default names every dimension; split_node_args
    runs its parts as squeeze.dims of the dimensions the whole call removes.
    """
    shape = call.shape("self")
    src = names(len(shape))
    dim = call.args.get("dim")
    asked = set() if dim == [] else norm_dims(dim, len(shape))  # squeeze.dims([]) is a no-op
    gone = [i for i in asked if shape[i] == 1]
    kept = asked if "dim" in call.args else set()
    dims = tuple(None if i in kept else d for i, d in enumerate(src))
    return Labeling({"self": dims}, [without(dims, gone)])


def unsqueeze(call: Call) -> Labeling:
    src = names(len(call.shape("self")))
    dim = norm_dim(call.arg("dim"), len(src) + 1)
    return Labeling({"self": src}, [src[:dim] + (None,) + src[dim:]])


def unbind(call: Call) -> Labeling:
    src = names(len(call.shape("self")))
    dim = norm_dim(call.arg("dim"), len(src))
    return Labeling({"self": cut(src, dim)}, [without(src, [dim])] * len(call.outputs))


def split(call: Call) -> Labeling:
    """split.Tensor, split_with_sizes: the split dimension is None."""
    src = names(len(call.shape("self")))
    dim = norm_dim(call.arg("dim"), len(src))
    dims = cut(src, dim)
    return Labeling({"self": dims}, [dims] * len(call.outputs))


def diagonal(call: Call) -> Labeling:
    src = names(len(call.shape("self")))
    d1, d2 = norm_dim(call.arg("dim1"), len(src)), norm_dim(call.arg("dim2"), len(src))
    return Labeling({"self": cut(cut(src, d1), d2)}, [without(src, [d1, d2]) + (None,)])


def view_as_real(call: Call) -> Labeling:
    src = names(len(call.shape("self")))
    return Labeling({"self": src}, [src + (None,)])


def view_as_complex(call: Call) -> Labeling:
    out = names(len(call.out))
    return Labeling({"self": out + (None,)}, [out])


def unfold(call: Call) -> Labeling:
    """unfold: the unfolded dimension becomes windows (None) plus a new window dimension."""
    rank = len(call.shape("self"))
    src = cut(names(rank), norm_dim(call.arg("dimension"), rank))
    return Labeling({"self": src}, [src + (None,)])


BUILDERS: dict[str, Builder] = {
    "aten.alias.default": identity,
    "aten.detach.default": identity,
    "aten.expand.default": expand,
    "aten.permute.default": permute,
    "aten.select.int": select,
    "aten.slice.Tensor": slice_,
    "aten.narrow.default": slice_,
    "aten.squeeze.dim": squeeze,
    "aten.squeeze.dims": squeeze,
    "aten.squeeze.default": squeeze,
    "aten.t.default": transpose,
    "aten.transpose.int": transpose,
    "aten.unsqueeze.default": unsqueeze,
    "aten.view.default": reshape,
    "aten._unsafe_view.default": reshape,
    "aten.unbind.int": unbind,
    "aten.split.Tensor": split,
    "aten.split_with_sizes.default": split,
    "aten.diagonal.default": diagonal,
    "aten.view_as_real.default": view_as_real,
    "aten.view_as_complex.default": view_as_complex,
    "aten.unfold.default": unfold,
}
