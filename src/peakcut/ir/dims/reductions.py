"""Rules of reductions, scans and softmax.

Kept dimensions are labels shared by input and output. A reduced dimension
is a reduce label when its part results merge exactly (sum, mean over equal
parts, max, min, prod, any, all, logsumexp); otherwise (var, norm, arg-max
indices, ...) it is None. With keepdim the output's size-1 dimension is None.
"""

from __future__ import annotations

from peakcut.ir.dims.call import Builder, Call, Labeling, aten
from peakcut.ir.dims.shapes import names, norm_dim, norm_dims


def _reduction(call: Call, dim_arg: str | None, merge: str | None) -> Labeling | None:
    """Reduce the dims named by `dim_arg` (every dim when None / absent / [])."""
    shape = call.shape("self")
    rank = len(shape)
    reduced = norm_dims(call.args.get(dim_arg) if dim_arg else None, rank)
    keepdim = bool(call.args.get("keepdim", False))
    out_rank = len(call.out)
    if out_rank == rank and reduced and not keepdim:
        keepdim = True  # e.g. argmax(dim=None, keepdim=True): trust the output's shape
    if out_rank != (rank if keepdim else rank - len(reduced)):
        return None  # a convention this builder does not know: no labels
    src = tuple((f"r{i}" if merge else None) if i in reduced else f"d{i}" for i in range(rank))
    if keepdim:
        out = tuple(None if i in reduced else d for i, d in enumerate(src))
    else:
        out = tuple(d for i, d in enumerate(src) if i not in reduced)
    merges = {} if merge is None else {d: merge for i, d in enumerate(src)
                                        if i in reduced and d is not None}
    return Labeling({"self": src}, [out] * len(call.outputs), merge=merges)


def reduction(dim_arg: str | None, merge: str | None) -> Builder:
    """A builder for a reduction over `dim_arg` whose parts merge by `merge` (None: never split)."""

    def build(call: Call) -> Labeling | None:
        return _reduction(call, dim_arg, merge)

    build.__doc__ = f"reduction over {dim_arg or 'all dims'}, parts merged by {merge}"
    return build


def along(*tensor_args: str) -> Builder:
    """Ops that work along one `dim` and keep the shape (softmax, cumsum, and their backwards):
    `dim` is None, every other dimension a label shared by the named tensors and the output."""

    def build(call: Call) -> Labeling:
        out = names(len(call.out))
        dim = norm_dim(call.arg("dim"), len(out))
        dims = tuple(None if i == dim else d for i, d in enumerate(out))
        return Labeling(dict.fromkeys(tensor_args, dims), [dims])

    return build


BUILDERS: dict[str, Builder] = {
    aten("sum.dim_IntList"): reduction("dim", "sum"),
    aten("sum.default"): reduction(None, "sum"),
    aten("mean.dim"): reduction("dim", "mean"),
    aten("mean.default"): reduction(None, "mean"),
    aten("amax"): reduction("dim", "amax"),
    aten("amin"): reduction("dim", "amin"),
    aten("max.dim"): reduction("dim", None),
    aten("min.dim"): reduction("dim", None),
    aten("argmax"): reduction("dim", None),
    aten("argmin"): reduction("dim", None),
    aten("var.correction"): reduction("dim", None),
    aten("var_mean.correction"): reduction("dim", None),
    aten("prod.dim_int"): reduction("dim", "prod"),
    aten("prod.default"): reduction(None, "prod"),
    aten("any.dim"): reduction("dim", "any"),
    aten("any.dims"): reduction("dim", "any"),
    aten("all.dim"): reduction("dim", "all"),
    aten("logsumexp"): reduction("dim", "logsumexp"),
    aten("norm.ScalarOpt_dim"): reduction("dim", None),
    aten("cumsum"): along("self"),
    aten("_softmax"): along("self"),
    aten("_safe_softmax"): along("self"),
    aten("_log_softmax"): along("self"),
    aten("_softmax_backward_data"): along("grad_output", "output"),
    aten("_log_softmax_backward_data"): along("grad_output", "output"),
}
