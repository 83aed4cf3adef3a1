"""merge_matmuls: matmuls that share one operand, or whose results are summed, become one.

TASO / MAGIS A-Trans (Fig. 1a). One matmul over the other operands concatenated, followed by
one aten.split_with_sizes (views):
- "cols": a shared left operand X (M x K), different right operands W_i (K x N_i): the QKV
  projections of attention (and the gate/up projections of a gated MLP) in forward,
  Y = X @ cat(W_1..W_k, dim=1), Y_i = Y[:, n_i-1:n_i]; addmm biases are concatenated too;
- "rows": a shared right operand X (K x N), different left operands G_i (M_i x K): the
  weight-gradient matmuls G_q^T @ X, G_k^T @ X, G_v^T @ X in backward,
  Y = cat(G_1..G_k, dim=0) @ X, Y_i = Y[m_i-1:m_i, :];
- "sum": no shared operand, but the results are added up (input gradients): one matmul over
  K concatenated replaces the tree of additions.
Operands that are all transposes of 2-D tensors (weights reach addmm as t(W); the gradients
as t(G)) are concatenated before the transpose: t(cat(W_i, dim=0)) instead of cat(t(W_i),
dim=1), so the cat copies contiguous rows and the matmul keeps its transposed layout. The
same numbers up to float rounding (each output element is the same dot product).

Costs: the concatenated operand is a new tensor every step (parameters too: they are program
inputs updated in place by the optimizer, so their concatenation is recomputed each step,
before the update: the optimizer's in-place writes wait for the cat). The merged output is one
storage that lives until the last reader of any part. The search weighs that against one large
matmul instead of k small ones. matmul_split.py undoes a merge.
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
    ancestors,
    check_order_matches,
    describe_node,
    describe_tensor,
)
from peakcut.transform.taso.edit import (
    Edit,
    common_module,
    is_view_op,
    same_region,
    why_not_writes,
)
from peakcut.transform.taso.matmul import (
    ADD,
    ADDMM,
    CAT,
    MM,
    SPLIT,
    Matmul,
    T,
    parse_matmul,
    transposed_source,
    why_not_output,
)
from peakcut.transform.taso.tag import TasoTag


@dataclass(frozen=True)
class _SumTree:
    """How the outputs of k bias-free matmuls are summed: each output, through an optional
    view, feeds a tree of aten.add.Tensor nodes (alpha 1, no broadcasting) whose inner nodes
    are read only by their parent; the tree's root also adds at most one other tensor."""

    views: tuple[int | None, ...]   # per matmul: the view node between it and the tree
    adds: tuple[int, ...]           # the tree's add nodes, root last
    root: int
    rest: int | None                # the other tensor the tree adds, if any


@dataclass(frozen=True)
class MergePlan:
    mms: tuple[Matmul, ...]     # in capture order
    mode: str                   # "cols" | "rows" | "sum"
    sizes: tuple[int, ...]      # N_i (cols), M_i (rows) or K_i (sum)
    tree: _SumTree | None = None
    biases: tuple[int, ...] = ()  # the addmm biases, per matmul (empty for aten.mm)


def _sole_reader(g: Graph, t: int) -> int | None:
    readers = g.users(t)
    return readers[0] if len(readers) == 1 and t not in g.outputs else None


def _is_plain_add(g: Graph, nid: int) -> bool:
    n = g.nodes[nid]
    if n.op != ADD or len(n.args) != 2 or not all(isinstance(a, TensorRef) for a in n.args):
        return False
    if n.kwargs.get("alpha", 1) != 1 or n.args[0] == n.args[1]:
        return False
    out = g.tensors[n.output_tuple[0]]
    return all(g.tensors[a.id].shape == out.shape and g.tensors[a.id].dtype == out.dtype
               for a in n.args)


def _sum_tree(g: Graph, mms: Sequence[Matmul]) -> _SumTree | str:
    """The add tree summing the matmuls' outputs (see _SumTree), or why there is none."""
    views: list[int | None] = []
    paths: list[list[int]] = []
    for m in mms:
        what = describe_node(g, m.node)
        r = _sole_reader(g, m.out)
        if r is None:
            return f"the output of {what} is not read by exactly one node"
        view = None
        if is_view_op(g.nodes[r].op):
            view = r
            outs = g.nodes[r].output_ids()
            r = _sole_reader(g, outs[0]) if len(outs) == 1 else None
            if r is None:
                return f"the view of the output of {what} is not read by exactly one node"
        if not _is_plain_add(g, r):
            return f"the output of {what} is not summed (read by {describe_node(g, r)})"
        views.append(view)
        path = [r]
        while True:
            up = _sole_reader(g, g.nodes[path[-1]].output_tuple[0])
            if up is None or not _is_plain_add(g, up):
                break
            path.append(up)
        paths.append(path)
    common = set(paths[0]).intersection(*paths[1:])
    if not common:
        return "the matmuls' outputs are not summed by one tree of additions"
    root = min(common, key=paths[0].index)
    adds = list(dict.fromkeys(a for p in paths for a in p[:p.index(root)]))
    tree = set(adds) | {root}
    made = {g.nodes[a].outputs[0] for a in tree}
    leaves = {g.nodes[v].outputs[0] if v is not None else m.out for m, v in zip(mms, views,
                                                                               strict=True)}
    rest = [a.id for n in tree for a in g.nodes[n].args if a.id not in made | leaves]
    if len(rest) > 1:
        return (f"the tree of additions ending at {describe_node(g, root)} adds "
                f"{len(rest)} other tensors (at most one is supported)")
    kinds = {(g.nodes[v].op, repr(g.nodes[v].args[1:]), repr(g.nodes[v].kwargs))
             if v is not None else None for v in views}
    if len(kinds) != 1:
        return "the matmuls' outputs reach the sum through different views"
    pos = {n: i for i, n in enumerate(g.order)}
    return _SumTree(tuple(views), tuple(sorted(adds, key=pos.__getitem__)) + (root,), root,
                    rest[0] if rest else None)


def plan_merge(g: Graph, order: Sequence[int], nodes: Sequence[int], *,
               checked: bool = False) -> MergePlan | str:
    """How the matmuls `nodes` merge, or why they cannot. checked: the caller has already
    verified that `order` is an order of g (skips that O(nodes) test)."""
    stale = None if checked else check_order_matches(g, order)
    if stale:
        return stale
    nodes = list(dict.fromkeys(nodes))
    if len(nodes) < 2:
        return f"merging needs at least two matmuls, got {len(nodes)}"
    parsed = []
    for nid in nodes:
        m = parse_matmul(g, nid)
        if isinstance(m, str):
            return m
        parsed.append(m)
    pos = {nid: i for i, nid in enumerate(g.order)}
    mms = tuple(sorted(parsed, key=lambda m: pos[m.node]))
    first = mms[0]
    ops = {m.op for m in mms}
    if len(ops) != 1:
        return (f"{describe_node(g, first.node)} and the others mix aten.mm and aten.addmm: "
                "merge matmuls of one kind")
    metas = [(g.tensors[m.a], g.tensors[m.b]) for m in mms]
    for m, (a, b) in zip(mms, metas, strict=True):
        if len(a.shape) != 2 or len(b.shape) != 2:
            return f"{describe_node(g, m.node)} does not multiply two matrices"
        if a.dtype != metas[0][0].dtype or b.dtype != metas[0][1].dtype:
            return f"{describe_node(g, m.node)} has other operand dtypes than the others"
    tree = None
    if all(same_region(a, metas[0][0]) for a, _ in metas):
        mode, sizes = "cols", tuple(b.shape[1] for _, b in metas)
    elif all(same_region(b, metas[0][1]) for _, b in metas):
        mode, sizes = "rows", tuple(a.shape[0] for a, _ in metas)
    else:
        out = g.tensors[first.out].shape
        found = (_sum_tree(g, mms) if first.op == MM and all(
            g.tensors[m.out].shape == out for m in mms) else "")
        if isinstance(found, str):
            return (f"{describe_node(g, first.node)} and {describe_node(g, mms[1].node)} share no "
                    "operand (same tensor memory and layout on the left or on the right) and "
                    f"their results are not summed{': ' + found if found else ''}")
        mode, sizes, tree = "sum", tuple(a.shape[1] for a, _ in metas), found
    biases: tuple[int, ...] = ()
    if first.op == ADDMM:
        if mode == "rows":
            return (f"{describe_node(g, first.node)} adds a bias: only bias-free matmuls that "
                    "share their right operand are merged")
        if len({(repr(m.beta), repr(m.alpha)) for m in mms}) != 1:
            return f"{describe_node(g, first.node)} and the others scale differently (beta/alpha)"
        biases = tuple(m.bias for m in mms if m.bias is not None)
        if len(biases) != len(mms):
            return f"{describe_node(g, first.node)} and the others: not every addmm has a bias"
        for m, bias_id, n in zip(mms, biases, sizes, strict=True):
            bias = g.tensors[bias_id]
            if bias.shape != (n,) or bias.dtype != g.tensors[biases[0]].dtype:
                return (f"the bias {describe_tensor(g, bias_id)} of {describe_node(g, m.node)} is "
                        f"not a vector of its {n} output features")
    for m in mms:
        reason = why_not_output(g, m)
        if reason:
            return f"{describe_node(g, m.node)}: {reason}"
    inputs = [t for m in mms for t in g.nodes[m.node].input_ids()]
    before = {m.node: ancestors(g, m.node) for m in mms}
    reason = why_not_writes(g, [m.node for m in mms], inputs, before)
    if reason:
        return reason
    for m in mms:
        for other in mms:
            if other.node in before[m.node]:
                return (f"{describe_node(g, m.node)} depends on {describe_node(g, other.node)}: "
                        "one merged matmul would depend on itself")
    if tree is not None and tree.rest is not None:
        rest = g.producer(tree.rest)
        if rest is not None and any(m.node in ancestors(g, rest) for m in mms):
            return (f"{describe_tensor(g, tree.rest)}, added to the matmuls' sum, depends on "
                    "one of them")
    return MergePlan(mms, mode, sizes, tree, biases)


def why_not_merge_matmuls(g: Graph, order: Sequence[int], nodes: Sequence[int]) -> str | None:
    """Why the matmuls `nodes` cannot be merged into one (None when merge_matmuls applies)."""
    plan = plan_merge(g, order, nodes)
    return plan if isinstance(plan, str) else None


def merge_summary(g: Graph, plan: MergePlan) -> str:
    """What merging the plan's matmuls does, in words (for candidates and descriptions)."""
    mms = plan.mms
    names = ", ".join(g.nodes[m.node].name or str(m.node) for m in mms)
    a, b = g.tensors[mms[0].a], g.tensors[mms[0].b]
    if plan.mode == "cols":
        what = (f"sharing their left operand: {a.shape[0]}x{a.shape[1]} @ "
                f"{b.shape[0]}x{sum(plan.sizes)} split into {list(plan.sizes)} columns")
        extra = "the weights (and biases) are concatenated every step"
    elif plan.mode == "rows":
        what = (f"sharing their right operand: {sum(plan.sizes)}x{a.shape[1]} @ "
                f"{b.shape[0]}x{b.shape[1]} split into {list(plan.sizes)} rows")
        extra = "the left operands are concatenated every step"
    else:
        what = (f"whose results are summed: {a.shape[0]}x{sum(plan.sizes)} @ "
                f"{sum(plan.sizes)}x{b.shape[1]} over K = {list(plan.sizes)}")
        extra = "both operands are concatenated every step, the additions go"
    module = common_module(g.nodes[m.node].module for m in mms)
    return (f"merge the matmuls {names}{' in ' + module if module else ''} {what}: "
            f"{len(mms)} matmul launches become 1; {extra}")


def is_contiguous(shape: Sequence[int], stride: Sequence[int]) -> bool:
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride), strict=True):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def _concat(edit: Edit, tensors: Sequence[int], dim: int, name: str, like: Node) -> int:
    """cat(tensors, dim) of 2-D tensors; as t(cat(x_i, 1 - dim)) when every tensor is x_i.t()
    of a contiguous x_i and not every tensor is contiguous itself (a weight reaches addmm as
    t(W): the cat then copies W's rows and the matmul keeps its transposed operand)."""
    g = edit.new
    sources = [s for t in tensors if (s := transposed_source(g, t)) is not None]

    def dense(ids: Sequence[int]) -> bool:
        return all(is_contiguous(g.tensors[i].shape, g.tensors[i].stride) for i in ids)

    def add(op: str, args: tuple[Any, ...], node_name: str) -> int:
        return edit.add(op, args, name=node_name, phase=like.phase,
                        module=like.module).output_tuple[0]

    if len(sources) == len(tensors) and dense(sources) and not dense(tensors):
        cat = add(CAT, ([TensorRef(s) for s in sources], 1 - dim), f"{name}_cat")
        return add(T, (TensorRef(cat),), name)
    return add(CAT, ([TensorRef(t) for t in tensors], dim), name)


def merge_matmuls(g: Graph, order: Sequence[int], nodes: Sequence[int]) -> Rewrite:
    """One matmul over concatenated operands for the matmuls `nodes`.

    - they share their left operand ("cols", forward QKV): X @ cat(W_i, 1), split along dim 1;
    - they share their right operand ("rows", weight gradients): cat(G_i, 0) @ X, split along
      dim 0;
    - they share nothing but their results are summed ("sum", input gradients
      G_q @ W_q + G_k @ W_k + G_v @ W_v): cat(G_i, 1) @ cat(W_i, 0) replaces the sum; the
      tree of additions goes (its root keeps adding the one other tensor it added, if any).

    Split parts are views (aten.split_with_sizes); readers of the original results read them
    and views of them are re-derived. The merged node carries the tag TasoTag('merge_matmuls',
    mode, sizes, merged=names) (split_matmul un-merges it). Raises RuleError (the reason of why_not_merge_matmuls) when the rule does not apply.
    """
    plan = plan_merge(g, order, nodes)
    if isinstance(plan, str):
        raise RuleError(plan)
    mms = plan.mms
    first = g.nodes[mms[0].node]
    edit = Edit(g, order, "merge_matmuls")
    module = common_module(g.nodes[m.node].module for m in mms)
    like = Node(id=-1, op="", args=(), kwargs={}, outputs=(), module=module, phase=first.phase)
    label = f"{first.name or first.id}_merged"
    names = [g.nodes[m.node].name or str(m.node) for m in mms]
    tag = TasoTag("merge_matmuls", mode=plan.mode, sizes=tuple(plan.sizes), merged=tuple(names))
    principals = [m.node for m in mms]

    def add_merged(op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None) -> Node:
        return edit.add(op, args, kwargs, name=label, phase=first.phase, module=module, tag=tag)

    if plan.mode == "cols":
        b = _concat(edit, [m.b for m in mms], 1, f"{label}_rhs", like)
        if first.op == ADDMM:
            bias = edit.add(CAT, ([TensorRef(t) for t in plan.biases], 0), name=f"{label}_bias",
                            phase=first.phase, module=module).output_tuple[0]
            merged = add_merged(ADDMM, (TensorRef(bias), TensorRef(mms[0].a), TensorRef(b)),
                                {k: v for k, v in first.kwargs.items() if k in ("beta", "alpha")})
        else:
            merged = add_merged(MM, (TensorRef(mms[0].a), TensorRef(b)))
        shape = "sharing their left operand"
    elif plan.mode == "rows":
        a = _concat(edit, [m.a for m in mms], 0, f"{label}_lhs", like)
        merged = add_merged(MM, (TensorRef(a), TensorRef(mms[0].b)))
        shape = "sharing their right operand"
    else:
        a = _concat(edit, [m.a for m in mms], 1, f"{label}_lhs", like)
        b = _concat(edit, [m.b for m in mms], 0, f"{label}_rhs", like)
        merged = add_merged(MM, (TensorRef(a), TensorRef(b)))
        shape = "whose results are summed"
    if plan.tree is None:
        dim = 1 if plan.mode == "cols" else 0
        split = edit.add(SPLIT, (TensorRef(merged.output_tuple[0]), list(plan.sizes), dim),
                         name=f"{label}_split", phase=first.phase, module=module,
                         multi_output=True)
        mapping = {m.out: part for m, part in zip(mms, split.output_tuple, strict=True)}
        users = edit.redirect(mapping)
        edit.rederive(users)
        tail = f"split {list(plan.sizes)} along dim {dim}"
    else:
        tree = plan.tree
        result = merged.output_tuple[0]
        if tree.views[0] is not None:
            v = g.nodes[tree.views[0]]
            result = edit.add(v.op, (TensorRef(result), *v.args[1:]), v.kwargs,
                              name=f"{label}_view", phase=first.phase,
                              module=module).output_tuple[0]
        root = g.nodes[tree.root]
        if tree.rest is not None:
            edit.replace_args(root.id, (TensorRef(tree.rest), TensorRef(result)))
        else:
            users = edit.redirect({root.output_tuple[0]: result})
            edit.rederive(users)
            edit.remove(root.id, stand_ins=(merged.id,))
        for nid in reversed(tree.adds[:-1]):
            edit.remove(nid, stand_ins=(merged.id,))
        for view in tree.views:
            if view is not None:
                edit.remove(view, stand_ins=(merged.id,))
        principals += [n for n in (*tree.adds, *tree.views) if n is not None]
        tail = (f"sum of K = {list(plan.sizes)}, replacing {len(tree.adds) - (tree.rest is not None)} "
                "addition(s)")
    for m in mms:
        edit.remove(m.node, stand_ins=(merged.id,))
    edit.inherit.update({a: tuple(p for p in principals if p in edit.removed)
                         for a in edit.added})
    edit.remove_dead(p for m in mms for t in g.nodes[m.node].input_ids()
                     if (p := g.producer(t)) is not None)
    return edit.finish(
        principals,
        f"merge {len(mms)} matmuls {shape} ({', '.join(names)}) in {module or 'the step'} "
        f"into one {'x'.join(map(str, _shape(edit, merged)))} {first.op.split('.')[1]} "
        f"({tail}): {len(mms)} matmul launches become 1, plus {len(edit.added) - 1} "
        "concatenation/view node(s) run every step",
    )


def _shape(edit: Edit, node: Node) -> tuple[int, ...]:
    return edit.new.tensors[node.output_tuple[0]].shape


def merged_info(g: Graph, nid: int) -> TasoTag | None:
    """The tag merge_matmuls left on the merged node `nid` (mode, sizes, names), or None."""
    tag = g.nodes[nid].tags.get(TasoTag)
    return tag if tag is not None and tag.rule == "merge_matmuls" else None
