"""Algebraic simplifications (MAGIS I-Trans; TASO properties 9 and 25-27) that fire on the
captured workloads. Each removes nodes whose result the rest of the graph can get directly:

- cancel_transposes: t(t(x)), transpose(transpose(x, a, b), a, b) or two permutes composing to
  the identity: readers of the outer view read x (backward reads a weight W as t(t(W)));
- fold_views: view(view(x, s1), s2) -> view(x, s2) (flattening batch x seq and back);
- drop_identity: a node whose result equals its input: alias, detach, expand / view to the
  input's own shape, add / sub of the scalar 0, mul / div by the scalar 1 (readers read the
  input; views of the dropped result follow it into the input's storage).

Views cost no kernel (the cost model charges a view its dispatch time only), so
cancel_transposes and fold_views shorten the graph and the dependency chains rather than the
step; drop_identity of an arithmetic op removes a kernel launch and a pass over the tensor.

Not added, for want of sites where they gain anything: mul(mul(x, a), b) -> mul(x, a * b)
(GPT-Neo's tanh-GELU backward has two such chains, but the inner product has a second reader,
so no kernel would go), mul / div by 1 (none captured; drop_identity covers them anyway).
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.tensor import Role
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    ancestors,
    check_order_matches,
    describe_node,
    describe_tensor,
    describe_users,
    writers_of,
)
from peakcut.transform.taso.edit import Edit, run_fake, same_region, scalar
from peakcut.transform.taso.matmul import view_closure

TRANSPOSES = ("aten.t.default", "aten.transpose.int", "aten.permute.default")
VIEWS = ("aten.view.default", "aten._unsafe_view.default")


def _single(g: Graph, nid: int) -> int | None:
    outs = g.nodes[nid].output_ids()
    return outs[0] if len(outs) == 1 else None


def _input(g: Graph, nid: int) -> int | None:
    n = g.nodes[nid]
    return n.args[0].id if n.args and isinstance(n.args[0], TensorRef) else None


def _one_to_one(g: Graph, order: Sequence[int], node: int, ops: Sequence[str],
                checked: bool = False) -> tuple[int, int] | str:
    """(input, output) of `node` when it is a one-tensor-to-one-tensor node of `ops` on
    (g, order), else why it is not. checked: the caller has already verified that `order` is
    an order of g (skips that O(nodes) test)."""
    if node not in g.nodes:
        return f"node {node} is not in the graph"
    stale = None if checked else check_order_matches(g, order)
    if stale:
        return stale
    n = g.nodes[node]
    if n.op not in ops:
        return f"{describe_node(g, node)} is not one of {', '.join(ops)}"
    x, out = _input(g, node), _single(g, node)
    if x is None or out is None:
        return f"{describe_node(g, node)} does not map one tensor to one tensor"
    return x, out


def _why_not_dropped(g: Graph, t: int) -> str | None:
    """The tensor t goes away (its readers read another one): not a program output, and a
    plain activation (a parameter's gradient keeps its name and role)."""
    meta = g.tensors[t]
    if t in g.outputs:
        return f"{describe_tensor(g, t)} is a program output"
    if meta.role is not Role.ACTIVATION:
        return f"{describe_tensor(g, t)} is a {meta.role.value} tensor, not a plain activation"
    return None


# ------------------------------------------------------------------ transposes
def _permutation(g: Graph, nid: int, source: int) -> list[int] | None:
    """The output's dim d is the input's (`source`'s) dim perm[d]."""
    n = g.nodes[nid]
    rank = len(g.tensors[source].shape)
    if n.op == "aten.t.default":
        return [1, 0] if rank == 2 else list(range(rank))
    if n.op == "aten.transpose.int" and len(n.args) == 3 and rank:
        a, b = n.args[1] % rank, n.args[2] % rank
        perm = list(range(rank))
        perm[a], perm[b] = perm[b], perm[a]
        return perm
    if n.op == "aten.permute.default" and len(n.args) == 2 and rank:
        return [d % rank for d in n.args[1]]
    return None


def _plan_transposes(g: Graph, order: Sequence[int], node: int,
                     checked: bool = False) -> tuple[int, int, int] | str:
    """(inner transpose, its input x, node's output) when `node` undoes the transpose it reads."""
    found = _one_to_one(g, order, node, TRANSPOSES, checked)
    if isinstance(found, str):
        return found
    y, out = found
    what = describe_node(g, node)
    inner = g.producer(y)
    x = _input(g, inner) if inner is not None else None
    if inner is None or g.nodes[inner].op not in TRANSPOSES or x is None:
        return f"{what} does not transpose the result of a transpose"
    outer_perm, inner_perm = _permutation(g, node, y), _permutation(g, inner, x)
    if outer_perm is None or inner_perm is None or len(outer_perm) != len(inner_perm):
        return f"{what} or {describe_node(g, inner)} has arguments peakcut does not read"
    if [inner_perm[d] for d in outer_perm] != list(range(len(outer_perm))):
        return f"{what} and {describe_node(g, inner)} do not undo each other"
    if not same_region(g.tensors[out], g.tensors[x]):
        return f"{describe_tensor(g, out)} does not look at {describe_tensor(g, x)} as it is"
    return _why_not_dropped(g, out) or (inner, x, out)


def why_not_cancel_transposes(g: Graph, order: Sequence[int], node: int, *,
                              checked: bool = False) -> str | None:
    """Why the transpose `node` of a transpose cannot be cancelled (None when it can).
    checked: the caller has already verified that `order` is an order of g."""
    plan = _plan_transposes(g, order, node, checked)
    return plan if isinstance(plan, str) else None


def cancel_transposes(g: Graph, order: Sequence[int], node: int) -> Rewrite:
    """Readers of `node` (a transpose undoing the transpose it reads) read the inner
    transpose's input; `node` goes, and the inner transpose too when nothing else reads it."""
    plan = _plan_transposes(g, order, node)
    if isinstance(plan, str):
        raise RuleError(plan)
    inner, x, out = plan
    edit = Edit(g, order, "cancel_transposes")
    users = edit.redirect({out: x})
    edit.remove(node, stand_ins=tuple(users))
    edit.remove_dead([inner])
    return edit.finish([node], (
        f"cancel {describe_node(g, node)} with {describe_node(g, inner)} (a transpose of a "
        f"transpose): {describe_users(g, users) or 'nobody'} read {describe_tensor(g, x)} "
        f"directly; {len(edit.removed)} view node(s) fewer, no kernel changes"))


# ------------------------------------------------------------------ views
def _plan_views(g: Graph, order: Sequence[int], node: int,
                checked: bool = False) -> tuple[int, int] | str:
    """(inner view, its input x) when `node` can view x directly."""
    found = _one_to_one(g, order, node, VIEWS, checked)
    if isinstance(found, str):
        return found
    y, result = found
    what = describe_node(g, node)
    inner = g.producer(y)
    x = _input(g, inner) if inner is not None else None
    if inner is None or g.nodes[inner].op not in VIEWS or x is None:
        return f"{what} does not view the result of a view"
    n = g.nodes[node]
    probe = Node(id=-1, op=n.op, args=(TensorRef(x), *n.args[1:]), kwargs=n.kwargs,
                 outputs=n.outputs)
    try:
        (out,) = run_fake(g, probe)
    except (RuleError, ValueError) as e:
        return f"{what} cannot view {describe_tensor(g, x)} directly: {e}"
    meta = g.tensors[result]
    got = (out[0], out[1], out[3]) if out is not None else None
    if got != (meta.shape, meta.stride, meta.storage_offset):
        return (f"{what} of {describe_tensor(g, x)} would give {got}, not the layout "
                f"{(meta.shape, meta.stride, meta.storage_offset)} of its result")
    return inner, x


def why_not_fold_views(g: Graph, order: Sequence[int], node: int, *,
                       checked: bool = False) -> str | None:
    """Why the view `node` of a view cannot read the inner view's input (None when it can).
    checked: the caller has already verified that `order` is an order of g."""
    plan = _plan_views(g, order, node, checked)
    return plan if isinstance(plan, str) else None


def fold_views(g: Graph, order: Sequence[int], node: int) -> Rewrite:
    """`node` = view(view(x, s1), s2) becomes view(x, s2) (the same elements in the same
    layout, checked on FakeTensors); the inner view goes when nothing else reads it."""
    plan = _plan_views(g, order, node)
    if isinstance(plan, str):
        raise RuleError(plan)
    inner, x = plan
    n = g.nodes[node]
    edit = Edit(g, order, "fold_views")
    edit.replace_args(node, (TensorRef(x), *n.args[1:]))
    edit.remove_dead([inner])
    return edit.finish([node], (
        f"fold {describe_node(g, node)} of {describe_node(g, inner)} into one view of "
        f"{describe_tensor(g, x)}; {len(edit.removed)} view node(s) fewer, no kernel changes"))


# ------------------------------------------------------------------ identities
_ZERO_OPS = ("aten.add.Tensor", "aten.sub.Tensor")
_ONE_OPS = ("aten.mul.Tensor", "aten.div.Tensor")
_SAME_SHAPE_VIEWS = ("aten.expand.default", "aten.view.default", "aten._unsafe_view.default")
IDENTITY_OPS = ("aten.alias.default", "aten.detach.default", *_SAME_SHAPE_VIEWS, *_ZERO_OPS,
                *_ONE_OPS)


def _plan_identity(g: Graph, order: Sequence[int], node: int,
                   checked: bool = False) -> tuple[int, int, bool] | str:
    """(x, node's output, is_view) when `node` returns x as it is."""
    found = _one_to_one(g, order, node, IDENTITY_OPS, checked)
    if isinstance(found, str):
        return found
    x, out = found
    n = g.nodes[node]
    what = describe_node(g, node)
    xm, om = g.tensors[x], g.tensors[out]
    if n.op in _ZERO_OPS or n.op in _ONE_OPS:
        neutral = 0 if n.op in _ZERO_OPS else 1
        if len(n.args) != 2 or not scalar(n.args[1]) or n.args[1] != neutral:
            return f"{what} does not {n.op.split('.')[1]} the scalar {neutral}"
        if (om.shape, om.stride, om.dtype) != (xm.shape, xm.stride, xm.dtype):
            return (f"{what} changes the layout or dtype of {describe_tensor(g, x)} "
                    f"({om.stride} {om.dtype} vs {xm.stride} {xm.dtype})")
        reason = _why_not_dropped(g, out)
        if reason:
            return reason
        held = g.output_storages()
        if om.storage in held:
            return f"{describe_tensor(g, out)} shares storage with a program output"
        before = ancestors(g, node)
        written = writers_of(g, {xm.storage, om.storage})
        for s, ms in written.items():
            for m in ms:
                if s == om.storage or m not in before:
                    return (f"{describe_node(g, m)} writes {describe_tensor(g, x if s == xm.storage else out)} "
                            f"in place after {what}: its readers would see the write")
        closure = view_closure(g, out)
        stray = [t.id for t in g.tensors.values() if t.storage == om.storage and t.id not in closure]
        if stray:
            return f"{describe_tensor(g, stray[0])} shares the storage of {describe_tensor(g, out)}"
        return x, out, False
    if n.op in _SAME_SHAPE_VIEWS:
        size = n.args[1] if len(n.args) > 1 else None
        if not isinstance(size, (list, tuple)) or om.shape != xm.shape:
            return f"{what} changes the shape of {describe_tensor(g, x)}"
    if not same_region(om, xm):
        return f"{what} does not return {describe_tensor(g, x)} as it is"
    return _why_not_dropped(g, out) or (x, out, True)


def why_not_drop_identity(g: Graph, order: Sequence[int], node: int, *,
                          checked: bool = False) -> str | None:
    """Why `node` cannot be dropped as an identity (None when it can).
    checked: the caller has already verified that `order` is an order of g."""
    plan = _plan_identity(g, order, node, checked)
    return plan if isinstance(plan, str) else None


def drop_identity(g: Graph, order: Sequence[int], node: int) -> Rewrite:
    """Readers of `node`, which returns its input x unchanged, read x; `node` goes. Views of an
    arithmetic identity's result move into x's storage."""
    plan = _plan_identity(g, order, node)
    if isinstance(plan, str):
        raise RuleError(plan)
    x, out, view = plan
    edit = Edit(g, order, "drop_identity")
    users = edit.redirect({out: x})
    if not view:
        edit.rederive(users)
    edit.remove(node, stand_ins=tuple(users))
    cost = "no kernel changes" if view else "one elementwise kernel and its output fewer"
    return edit.finish([node], (
        f"drop {describe_node(g, node)} (returns its input unchanged): "
        f"{describe_users(g, users) or 'nobody'} read {describe_tensor(g, x)}; {cost}"))
