"""split_matmul: the inverse of merge_matmuls, and a split of any matmul's output features.

On a node merge_matmuls made, it un-merges (the k matmuls read the concatenated pieces again;
the cat and the split go, or the additions come back for a "sum" merge); on any other
mm/addmm it splits the output features N into parts: k matmuls over slices of the weight (and
bias) and an aten.cat of their outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    check_order_matches,
    describe_node,
    describe_tensor,
    describe_users,
)
from peakcut.transform.taso.edit import Edit, is_view_op
from peakcut.transform.taso.matmul import (
    ADD,
    CAT,
    MM,
    SLICE,
    SPLIT,
    Matmul,
    T,
    parse_matmul,
    transposed_source,
    why_not_output,
)
from peakcut.transform.taso.matmul_merge import merged_info
from peakcut.transform.taso.tag import TasoTag


@dataclass(frozen=True)
class _SplitPlan:
    mm: Matmul
    sizes: tuple[int, ...]
    unmerge: bool
    mode: str                  # "cols" | "rows" | "sum" (rows and sum only for un-merging)
    split_node: int | None     # the merged node's split, when un-merging


def near_equal_parts(n: int, k: int) -> tuple[int, ...]:
    return tuple(n // k + (1 if i < n % k else 0) for i in range(k))


def _plan_split(g: Graph, order: Sequence[int], node: int,
                parts: int | Sequence[int] | None, checked: bool = False) -> _SplitPlan | str:
    stale = None if checked else check_order_matches(g, order)
    if stale:
        return stale
    m = parse_matmul(g, node)
    if isinstance(m, str):
        return m
    what = describe_node(g, node)
    a, b = g.tensors[m.a], g.tensors[m.b]
    if len(a.shape) != 2 or len(b.shape) != 2:
        return f"{what} does not multiply two matrices"
    info = merged_info(g, node)
    if parts is None and info is not None:
        sizes = info.sizes
        mode = info.mode
        if mode not in ("cols", "rows", "sum") or len(sizes) < 2:
            return f"{what} carries a broken merge record {info}"
        reason = why_not_output(g, m)
        if reason:
            return f"{what}: {reason}"
        if mode == "sum":
            if a.shape[1] != sum(sizes) or b.shape[0] != sum(sizes):
                return f"{what} no longer multiplies over {sum(sizes)} = {' + '.join(map(str, sizes))}"
            return _SplitPlan(m, sizes, True, mode, None)
        readers = g.users(m.out)
        dim = 1 if mode == "cols" else 0
        if len(readers) != 1 or g.nodes[readers[0]].op != SPLIT:
            return (f"the result of merged {what} is not read by one split only: it cannot be "
                    "un-merged (split it with explicit parts instead)")
        sp = g.nodes[readers[0]]
        if list(sp.args[1]) != list(sizes) or (sp.args[2] if len(sp.args) > 2 else 0) != dim:
            return f"{describe_node(g, sp.id)} does not split {what} as it was merged"
        if g.tensors[m.out].shape[dim] != sum(sizes):
            return f"{what} no longer has {sum(sizes)} {'columns' if dim else 'rows'}"
        if any(t in g.outputs for t in sp.output_ids()):
            return f"a part of {describe_node(g, sp.id)} is a program output"
        return _SplitPlan(m, sizes, True, mode, sp.id)
    n = b.shape[1]
    if parts is None:
        parts = 2
    sizes = near_equal_parts(n, parts) if isinstance(parts, int) else tuple(int(p) for p in parts)
    if len(sizes) < 2 or any(s <= 0 for s in sizes) or sum(sizes) != n:
        return (f"cannot split the {n} output features of {what} into parts {list(sizes)} "
                "(at least two positive parts summing to the features)")
    if m.bias is not None:
        bias = g.tensors[m.bias]
        if bias.shape and bias.shape[-1] not in (1, n):
            return f"the bias {describe_tensor(g, m.bias)} of {what} does not broadcast along N"
    reason = why_not_output(g, m)
    if reason:
        return f"{what}: {reason}"
    return _SplitPlan(m, sizes, False, "cols", None)


def why_not_split_matmul(g: Graph, order: Sequence[int], node: int,
                         parts: int | Sequence[int] | None = None, *,
                         checked: bool = False) -> str | None:
    """Why `node` cannot be split (None when split_matmul applies). checked: the caller has
    already verified that `order` is an order of g."""
    plan = _plan_split(g, order, node, parts, checked)
    return plan if isinstance(plan, str) else None


def _pieces(edit: Edit, t: int, sizes: Sequence[int], dim: int, name: str,
            like: Node) -> list[int]:
    """Tensors for the parts of the 2-D tensor t along dim: the inputs of the cat that made it
    (through a transpose: t(cat(x_i)) gives t(x_i)) when it was concatenated in exactly these
    parts, else slices of it (slices of x before the transpose when t = x.t())."""
    g = edit.new

    def cat_parts(x: int, along: int) -> list[int] | None:
        p = g.producer(x)
        if p is None or g.nodes[p].op != CAT:
            return None
        n = g.nodes[p]
        cat_dim = n.args[1] if len(n.args) > 1 else n.kwargs.get("dim", 0)
        if cat_dim % 2 != along or not isinstance(n.args[0], (list, tuple)):
            return None
        ids = [r.id for r in n.args[0] if isinstance(r, TensorRef)]
        if len(ids) != len(n.args[0]) or [g.tensors[i].shape[along] for i in ids] != list(sizes):
            return None
        return ids

    src = transposed_source(g, t)
    if src is not None:
        found = cat_parts(src, 1 - dim)
        if found is None:
            found = []
            start = 0
            for i, s in enumerate(sizes):
                found.append(edit.add(SLICE, (TensorRef(src), 1 - dim, start, start + s),
                                      name=f"{name}_{i}_slice", phase=like.phase,
                                      module=like.module).output_tuple[0])
                start += s
        return [_transpose_of(edit, x, f"{name}_{i}", like) for i, x in enumerate(found)]
    found = cat_parts(t, dim)
    if found is not None:
        return found
    out: list[int] = []
    start = 0
    for i, s in enumerate(sizes):
        out.append(edit.add(SLICE, (TensorRef(t), dim, start, start + s), name=f"{name}_{i}",
                            phase=like.phase, module=like.module).output_tuple[0])
        start += s
    return out


def _transpose_of(edit: Edit, x: int, name: str, like: Node) -> int:
    """x.t(): the output of an existing aten.t node reading x that runs before `like` (the
    node being split) in both orders, else of a new one."""
    g = edit.new
    for u in g.users(x):
        n = g.nodes[u]
        if (n.op == T and len(n.output_ids()) == 1 and n.id not in edit.added
                and edit.runs_before(n.id, like.id)):
            return n.output_ids()[0]
    return edit.add(T, (TensorRef(x),), name=name, phase=like.phase,
                    module=like.module).output_tuple[0]


def _bias_pieces(edit: Edit, bias: int, sizes: Sequence[int], name: str, like: Node) -> list[int]:
    meta = edit.new.tensors[bias]
    if not meta.shape or meta.shape[-1] == 1 and sum(sizes) != 1:
        return [bias] * len(sizes)
    if len(meta.shape) == 1:
        return _pieces_1d(edit, bias, sizes, name, like)
    return _pieces(edit, bias, sizes, len(meta.shape) - 1, name, like)


def _pieces_1d(edit: Edit, t: int, sizes: Sequence[int], name: str, like: Node) -> list[int]:
    g = edit.new
    p = g.producer(t)
    if p is not None and g.nodes[p].op == CAT:
        n = g.nodes[p]
        ids = [r.id for r in n.args[0] if isinstance(r, TensorRef)]
        if len(ids) == len(n.args[0]) and [g.tensors[i].shape[0] for i in ids] == list(sizes):
            return ids
    out: list[int] = []
    start = 0
    for i, s in enumerate(sizes):
        out.append(edit.add(SLICE, (TensorRef(t), 0, start, start + s), name=f"{name}_{i}",
                            phase=like.phase, module=like.module).output_tuple[0])
        start += s
    return out


def split_matmul(g: Graph, order: Sequence[int], node: int,
                 parts: int | Sequence[int] | None = None) -> Rewrite:
    """Split the mm / addmm `node`.

    parts None on a node merge_matmuls made: un-merge it (k matmuls reading the concatenated
    pieces again; readers of the split parts read their outputs; the cat(s) and split go when
    nothing else reads them). Otherwise parts (an int k, default 2, for near-equal parts, or
    the sizes) split the output features N: k matmuls over slices of the weight (and bias)
    whose outputs an aten.cat joins into the original result. Raises RuleError (the reason of
    why_not_split_matmul) when the rule does not apply.
    """
    plan = _plan_split(g, order, node, parts)
    if isinstance(plan, str):
        raise RuleError(plan)
    m = plan.mm
    n = g.nodes[node]
    edit = Edit(g, order, "split_matmul")
    label = n.name or str(node)
    like = n
    k = len(plan.sizes)
    kwargs = {kk: v for kk, v in n.kwargs.items() if kk in ("beta", "alpha")}

    def add(op: str, args: tuple[Any, ...], name: str, op_kwargs: Mapping[str, Any] | None = None,
            part: int | None = None) -> Node:
        tag = None if part is None else TasoTag("split_matmul", part=part, part_of=label)
        return edit.add(op, args, op_kwargs, name=name, phase=n.phase, module=n.module, tag=tag)

    info = merged_info(g, node)
    names = list(info.merged) if plan.unmerge and info is not None else []
    if len(names) != k:
        names = [f"{label}_part{i}" for i in range(k)]
    if plan.mode == "cols":
        bs = _pieces(edit, m.b, plan.sizes, 1, f"{label}_rhs", like)
        biases = (_bias_pieces(edit, m.bias, plan.sizes, f"{label}_bias", like)
                  if m.bias is not None else None)
        outs = []
        for i in range(k):
            args: tuple[TensorRef, ...] = (TensorRef(m.a), TensorRef(bs[i]))
            if biases is not None:
                args = (TensorRef(biases[i]), *args)
            outs.append(add(m.op, args, names[i], kwargs, part=i))
    elif plan.mode == "rows":
        as_ = _pieces(edit, m.a, plan.sizes, 0, f"{label}_lhs", like)
        outs = [add(MM, (TensorRef(as_[i]), TensorRef(m.b)), names[i], part=i) for i in range(k)]
    else:
        as_ = _pieces(edit, m.a, plan.sizes, 1, f"{label}_lhs", like)
        bs = _pieces(edit, m.b, plan.sizes, 0, f"{label}_rhs", like)
        outs = [add(MM, (TensorRef(as_[i]), TensorRef(bs[i])), names[i], part=i) for i in range(k)]
    results = [o.output_tuple[0] for o in outs]
    if plan.mode == "sum":
        readers = g.users(m.out)
        target = m.out
        view = g.nodes[readers[0]] if len(readers) == 1 else None
        if view is not None and is_view_op(view.op) and len(view.output_ids()) == 1:
            results = [add(view.op, (TensorRef(r), *view.args[1:]), f"{names[i]}_view",
                           view.kwargs).output_tuple[0]
                       for i, r in enumerate(results)]
            target = view.output_ids()[0]
        else:
            view = None
        total = results[0]
        for i, r in enumerate(results[1:], 1):
            total = add(ADD, (TensorRef(total), TensorRef(r)), f"{label}_sum{i}").output_tuple[0]
        users = edit.redirect({target: total})
        edit.rederive(users)
        if view is not None:
            edit.remove(view.id, stand_ins=tuple(o.id for o in outs))
        edit.remove(node, stand_ins=tuple(o.id for o in outs))
        what = (f"un-merge {describe_node(g, node)} into {k} matmuls ({', '.join(names)}) and "
                f"{k - 1} addition(s) of their results; readers {describe_users(g, users)}")
    elif plan.split_node is not None:   # un-merging "cols" / "rows": the merged split goes
        sp = g.nodes[plan.split_node]
        users = edit.redirect(dict(zip(sp.output_ids(), results, strict=True)))
        edit.rederive(users)
        edit.remove(sp.id, stand_ins=tuple(o.id for o in outs))
        edit.remove(node, stand_ins=tuple(o.id for o in outs))
        what = (f"un-merge {describe_node(g, node)} into {k} matmuls "
                f"({', '.join(names)}) reading the pieces of its concatenated operand again; "
                f"readers {describe_users(g, users)}")
    else:
        cat = add(CAT, ([TensorRef(r) for r in results], 1), f"{label}_cat")
        users = edit.redirect({m.out: cat.output_tuple[0]})
        edit.rederive(users)
        edit.remove(node, stand_ins=(cat.id,))
        what = (f"split {describe_node(g, node)} along its {sum(plan.sizes)} output features "
                f"into {k} matmuls {list(plan.sizes)} and a cat: 1 matmul launch becomes {k}, "
                f"plus {len(edit.added) - k} slice/cat node(s)")
    edit.inherit.update({a: (node,) for a in edit.added})
    edit.remove_dead(p for t in n.input_ids() if (p := g.producer(t)) is not None)
    return edit.finish([node], what)
