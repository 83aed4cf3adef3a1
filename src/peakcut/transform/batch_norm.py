"""Training-mode batch norm as ops a batch split can cross.

`native_batch_norm` in training mode takes its statistics over the whole batch, so no
fission region can split the batch across it (peakcut.fission.build BATCH_STATISTICS). This
rewrite spells it, and its backward, as ops whose batch dimension the D-Graph follows:

forward  (x: [N, C, *S], statistics in x's dtype, fp32 or fp64 only)
    v, m     = var_mean(x, S dims, correction=0)       per sample and channel: [N, C]
    mean     = mean(m, 0)                              the batch's mean
    var      = mean(v, 0) + var(m, 0, correction=0)    the batch's biased variance
    invstd   = rsqrt(var + eps)
    y        = addcmul(beta, x, alpha)                 alpha = invstd * w, beta = b - mean * alpha
    running_mean.lerp_(mean, momentum); running_var.lerp_(var * M / (M - 1), momentum)
backward (dy; M = N * prod(S))
    xc       = x - mean;  dotp = sum(dy * xc);  db = sum(dy);  dw = dotp * invstd
    dx       = (dy - db / M - xc * (dotp * invstd**2 / M)) * (invstd * w)

These are PyTorch's CPU kernel's formulas (y = x * alpha + beta; the backward's k =
dotp * invstd**2 / M), with the variance combined from per-sample variances (the law of
total variance) instead of one pass over the batch: the same numbers up to rounding
(tests compare with tolerances from the dtype and the reduction length). The per-sample
statistics, the sums and every full-size op split along the batch; the few ops on [N, C]
and [C] tensors are where a region ends. The rewritten step costs more than the fused
kernels (three full-size temporaries in the backward): the search applies it only where
a split across batch norms pays (peakcut.rules.batch_norm_rule).

Refused (with the node named): eval-mode batch norm (nothing to split), inputs of rank < 3 or
dtypes other than fp32/fp64 (the kernel keeps bf16/fp16 statistics in fp32). Control edges of
the batch norm and its backward (an in-place update of the weight after its readers) hold for
every node that replaces them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.infer import InferenceError
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.tags import NodeTags
from peakcut.transform.rewrite import (
    Rewrite,
    RewrittenFromTag,
    RuleError,
    check_order_matches,
    describe_node,
)

FORWARD_OP = "aten.native_batch_norm.default"
BACKWARD_OP = "aten.native_batch_norm_backward.default"
_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class BatchNormSite:
    """One training-mode batch norm and the backward nodes that read its statistics."""

    forward: int
    backwards: tuple[int, ...]


def find_batch_norms(g: Graph) -> list[BatchNormSite]:
    """Every training-mode batch norm of g (originals and recomputed copies), in order."""
    sites = []
    for nid in g.order:
        node = g.nodes[nid]
        if node.op != FORWARD_OP or not _training(node):
            continue
        stats = {t for t in node.outputs[1:3] if t is not None}
        readers = tuple(dict.fromkeys(u for t in stats for u in g.users(t)))
        sites.append(BatchNormSite(nid, readers))
    return sites


def _training(node: Node) -> bool:
    return len(node.args) > 5 and node.args[5] is True


def why_not_split(g: Graph, site: BatchNormSite) -> str | None:
    """Why `site` cannot be rewritten (None when it can)."""
    node = g.nodes.get(site.forward)
    if node is None or node.op != FORWARD_OP:
        return f"node {site.forward} is not a batch norm of this graph"
    what = describe_node(g, site.forward)
    if not _training(node):
        return f"{what} runs in eval mode: it is element-wise, a batch split crosses it as it is"
    if any(t is None for t in node.outputs[:3]):
        return f"{what} lacks an output (the result or its statistics)"
    x = g.tensors[node.args[0].id]
    if len(x.shape) < 3:
        return f"{what} normalizes a rank-{len(x.shape)} input: only [N, C, *spatial] inputs are split"
    if x.dtype not in _DTYPES:
        return (f"{what} normalizes a {x.dtype} input: its kernel keeps the statistics in float32, "
                "the rewrite would compute them in the input's dtype")
    for v in site.backwards:
        b = g.nodes[v]
        if b.op != BACKWARD_OP:
            return f"{describe_node(g, v)} reads the statistics of {what}: only its backward may"
        if b.args[1:3] != node.args[0:2] or b.args[7] is not True or [
                r.id if isinstance(r, TensorRef) else None for r in b.args[5:7]] != list(node.outputs[1:3]):
            return f"{describe_node(g, v)} is not the training backward of {what} on the same input"
    return None


class BatchNormOps:
    """Adds nodes named after a batch norm (`<name>_<tag>`), in its module, in `phase`, tagged
    as rewritten from native_batch_norm; `added` lists them in order."""

    def __init__(self, edit: GraphEditor, base: Node, phase: Phase) -> None:
        self.edit, self.base, self.phase = edit, base, phase
        self.tags = NodeTags(RewrittenFromTag("native_batch_norm"))
        self.added: list[int] = []

    def __call__(self, op: str, *args: object, tag: str, outputs: Sequence[int] | None = None,
                 multi_output: bool = False, **kwargs: Any) -> list[int | None]:
        node = self.edit.add_op(f"aten.{op}", tuple(args), dict(kwargs), name=f"{self.base.name}_{tag}",
                                phase=self.phase, module=self.base.module, multi_output=multi_output,
                                tags=self.tags, outputs=outputs)
        self.added.append(node.id)
        return list(node.outputs)

    def one(self, op: str, *args: object, tag: str, outputs: Sequence[int] | None = None,
            **kwargs: Any) -> TensorRef:
        (out,) = self(op, *args, tag=tag, outputs=outputs, **kwargs)
        if out is None:
            raise GraphError(f"{op} gave no tensor")
        return TensorRef(out)


def _broadcast(ops: BatchNormOps, t: TensorRef, channels: int, rank: int, tag: str) -> TensorRef:
    return ops.one("view.default", t, [1, channels] + [1] * (rank - 2), tag=f"{tag}_b")


def normalize(ops: BatchNormOps, x: TensorRef, w: TensorRef | None, b: TensorRef | None, mean: TensorRef,
              invstd: TensorRef, shape: Sequence[int], outputs: Sequence[int] | None = None) -> TensorRef:
    """y = addcmul(beta, x, alpha), alpha = invstd * w, beta = b - mean * alpha, per channel:
    the kernel's normalize (module doc), for x of `shape` [N, C, *S]."""
    rank, channels = len(shape), shape[1]
    alpha = invstd if w is None else ops.one("mul.Tensor", invstd, w, tag="alpha")
    shift = ops.one("mul.Tensor", mean, alpha, tag="mean_alpha")
    beta = ops.one("neg.default", shift, tag="beta") if b is None else ops.one("sub.Tensor", b, shift, tag="beta")
    return ops.one("addcmul.default", _broadcast(ops, beta, channels, rank, "beta"), x,
                   _broadcast(ops, alpha, channels, rank, "alpha"), tag="out", outputs=outputs)


def _kept(t: int | None, keep: set[int]) -> list[int] | None:
    """`outputs` for the op that stands for tensor t: t itself where someone reads it, else a
    fresh tensor (None)."""
    return [t] if t is not None and t in keep else None


def _forward(edit: GraphEditor, g: Graph, node: Node, keep: set[int]) -> tuple[list[int], dict[str, TensorRef]]:
    x, w, b, rm, rv, _, momentum, eps = node.args[:8]
    meta = g.tensors[x.id]
    rank, channels = len(meta.shape), meta.shape[1]
    count = meta.numel // channels
    ops = BatchNormOps(edit, node, node.phase)
    v, m = (TensorRef(t) if t is not None else None
            for t in ops("var_mean.correction", x, list(range(2, rank)), tag="sample_stats", correction=0,
                                     multi_output=True))
    if v is None or m is None:
        raise GraphError("var_mean gave no tensors")
    mean = ops.one("mean.dim", m, [0], tag="mean")
    within = ops.one("mean.dim", v, [0], tag="var_within")
    between = ops.one("var.correction", m, [0], tag="var_between", correction=0)
    var = ops.one("add.Tensor", within, between, tag="var")
    invstd = ops.one("rsqrt.default", ops.one("add.Scalar", var, eps, tag="var_eps"), tag="invstd")
    normalize(ops, x, w, b, mean, invstd, meta.shape, _kept(node.outputs[0], keep))
    if rm is not None:
        ops("lerp_.Scalar", rm, mean, momentum, tag="running_mean")
    if rv is not None:
        unbiased = ops.one("mul.Scalar", var, count / max(count - 1, 1), tag="var_unbiased")
        ops("lerp_.Scalar", rv, unbiased, momentum, tag="running_var")
    return ops.added, {"mean": mean, "invstd": invstd}


def _backward(edit: GraphEditor, g: Graph, node: Node, stats: dict[str, TensorRef], keep: set[int]) -> list[int]:
    dy, x, w = node.args[0:3]
    mask = node.args[9] if len(node.args) > 9 else [True, True, True]
    meta = g.tensors[x.id]
    rank, channels = len(meta.shape), meta.shape[1]
    count = meta.numel // channels
    dims = [0, *range(2, rank)]
    ops = BatchNormOps(edit, node, node.phase)
    mean, invstd = stats["mean"], stats["invstd"]
    dx_out, dw_out, db_out = node.outputs
    xc = ops.one("sub.Tensor", x, _broadcast(ops, mean, channels, rank, "mean"), tag="centered")
    dotp = ops.one("sum.dim_IntList", ops.one("mul.Tensor", dy, xc, tag="dy_centered"), dims, tag="dotp")
    db = ops.one("sum.dim_IntList", dy, dims, tag="grad_bias",
                 outputs=_kept(db_out, keep) if mask[2] else None)
    if mask[1] and dw_out in keep:
        ops("mul.Tensor", dotp, invstd, tag="grad_weight", outputs=_kept(dw_out, keep))
    if mask[0] and dx_out in keep:
        k = ops.one("div.Scalar", ops.one("mul.Tensor", dotp, ops.one("mul.Tensor", invstd, invstd, tag="invvar"),
                                          tag="dotp_invvar"), count, tag="k")
        mean_dy = ops.one("div.Scalar", db, count, tag="mean_dy")
        centered_dy = ops.one("sub.Tensor", dy, _broadcast(ops, mean_dy, channels, rank, "mean_dy"), tag="dy_c")
        t = ops.one("addcmul.default", centered_dy, xc, _broadcast(ops, k, channels, rank, "k"), tag="dy_k",
                    value=-1)
        scale = invstd if w is None else ops.one("mul.Tensor", invstd, w, tag="scale")
        ops("mul.Tensor", t, _broadcast(ops, scale, channels, rank, "scale"), tag="grad_input", outputs=_kept(dx_out, keep))
    return ops.added


def _carry_control(edit: GraphEditor, g: Graph, replaced: dict[int, list[int]]) -> None:
    """Control edges of the replaced nodes carried to all their new nodes: "M after the batch
    norm" (an update of its weight waits for its readers) becomes M after each of them."""
    def mapped(preds: Sequence[int]) -> tuple[int, ...]:
        return tuple(dict.fromkeys(x for p in preds for x in replaced.get(p, (p,))))

    for k, preds in g.control.items():
        if k in replaced:
            for a in replaced[k]:
                edit.set_control(a, mapped(preds))
        elif any(p in replaced for p in preds):
            edit.set_control(k, mapped(preds))


def split_batch_norms(g: Graph, order: Sequence[int], sites: Sequence[BatchNormSite]
                      ) -> tuple[Rewrite | None, list[str | None]]:
    """Every site that can be rewritten, rewritten in one edit; the reason per site (None:
    done). The Rewrite is None when none could."""
    stale = check_order_matches(g, order)
    if stale:
        return None, [stale] * len(sites)
    reasons: list[str | None] = [why_not_split(g, s) for s in sites]
    todo = [s for s, r in zip(sites, reasons, strict=True) if r is None]
    if not todo:
        return None, reasons
    edit = GraphEditor(g)
    replaced: dict[int, list[int]] = {}
    for s in todo:
        fw = g.nodes[s.forward]
        bws = [g.nodes[v] for v in s.backwards]
        gone = {fw.id, *s.backwards}
        keep = {t for n in (fw, *bws) for t in n.output_ids()
                if t in g.outputs or any(u not in gone for u in g.users(t))}
        edit.remove_nodes([fw.id, *(b.id for b in bws)], keep_tensors=keep)
        try:
            added, stats = _forward(edit, g, fw, keep)
            replaced[fw.id] = added
            for b in bws:
                replaced[b.id] = _backward(edit, g, b, stats, keep)
        except (InferenceError, GraphError) as e:
            raise RuleError(f"{describe_node(g, s.forward)}: {e}") from e
    _carry_control(edit, g, replaced)
    capture = [x for v in g.order for x in replaced.get(v, (v,))]
    edit.set_order(capture)
    new_order = [x for v in order for x in replaced.get(v, (v,))]
    done = [v for s in todo for v in (s.forward, *s.backwards)]
    return Rewrite(
        graph=edit.finish(), order=new_order, added=tuple(x for v in done for x in replaced[v]), changed=(),
        removed=tuple(done),
        description=f"batch norm split into batch-splittable ops at {len(todo)} batch norm(s)",
    ), reasons


def split_batch_norms_everywhere(g: Graph, order: Sequence[int] | None = None) -> Rewrite | None:
    """Every training-mode batch norm of g that can be rewritten, rewritten (None: none)."""
    rw, _ = split_batch_norms(g, g.order if order is None else order, find_batch_norms(g))
    return rw

