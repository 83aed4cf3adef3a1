"""Aggregation of matmuls (TASO / MAGIS A-Trans, Fig. 1a) and its inverse.

merge_matmuls: matmuls that share one operand become one matmul over the other operands
concatenated, followed by one aten.split_with_sizes (views):
- "cols": a shared left operand X (M x K), different right operands W_i (K x N_i): the QKV
  projections of attention (and the gate/up projections of a gated MLP) in forward,
  Y = X @ cat(W_1..W_k, dim=1), Y_i = Y[:, n_i-1:n_i]; addmm biases are concatenated too;
- "rows": a shared right operand X (K x N), different left operands G_i (M_i x K): the
  weight-gradient matmuls G_q^T @ X, G_k^T @ X, G_v^T @ X in backward,
  Y = cat(G_1..G_k, dim=0) @ X, Y_i = Y[m_i-1:m_i, :].
Operands that are all transposes of 2-D tensors (weights reach addmm as t(W); the gradients
as t(G)) are concatenated before the transpose: t(cat(W_i, dim=0)) instead of cat(t(W_i),
dim=1), so the cat copies contiguous rows and the matmul keeps its transposed layout. The
same numbers up to float rounding (each output element is the same dot product).

Costs: the concatenated operand is a new tensor every step (parameters too: they are program
inputs updated in place by the optimizer, so their concatenation is recomputed each step,
before the update: the optimizer's in-place writes wait for the cat). The merged output is one
storage that lives until the last reader of any part. The search weighs that against one large
matmul instead of k small ones.

split_matmul: the inverse. On a node merge_matmuls made, it un-merges (the k matmuls read the
concatenated pieces again; the cat and the split go); on any other mm/addmm it splits the
output features N into parts: k matmuls over slices of the weight (and bias) and an aten.cat
of their outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.registry import bind_arguments
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
from peakcut.transform.taso.edit import TASO, Edit, common_module, same_region, why_not_writes

MM = "aten.mm.default"
ADDMM = "aten.addmm.default"
CAT = "aten.cat.default"
SPLIT = "aten.split_with_sizes.default"
SLICE = "aten.slice.Tensor"
T = "aten.t.default"
MATMULS = (MM, ADDMM)


@dataclass(frozen=True)
class Matmul:
    """One mm / addmm: out (M x N) = beta * bias + alpha * a (M x K) @ b (K x N)."""

    node: int
    op: str
    a: int
    b: int
    bias: int | None
    beta: Any
    alpha: Any
    out: int


def parse_matmul(g: Graph, nid: int) -> Matmul | str:
    """The operands of an mm / addmm node, or why it is not one peakcut can rewrite."""
    if nid not in g.nodes:
        return f"node {nid} is not in the graph"
    n = g.nodes[nid]
    what = describe_node(g, nid)
    if n.op not in MATMULS:
        return f"{what} is not a matmul (aten.mm / aten.addmm)"
    schema = n.overload()._schema.arguments
    bound = bind_arguments(schema, n.args, n.kwargs)
    refs = {k: v.id for k, v in bound.items() if isinstance(v, TensorRef)}
    outs = n.output_ids()
    if len(outs) != 1:
        return f"{what} has no single output"
    if n.op == MM:
        if set(refs) != {"self", "mat2"}:
            return f"{what} has operands that are not tensors"
        return Matmul(nid, n.op, refs["self"], refs["mat2"], None, 1, 1, outs[0])
    if set(refs) != {"self", "mat1", "mat2"}:
        return f"{what} has operands that are not tensors"
    return Matmul(nid, n.op, refs["mat1"], refs["mat2"], refs["self"], bound["beta"],
                  bound["alpha"], outs[0])


def transposed_source(g: Graph, t: int) -> int | None:
    """x when tensor t is x.t() (or transpose(0, 1) / permute([1, 0])) of a 2-D x."""
    p = g.producer(t)
    if p is None:
        return None
    n = g.nodes[p]
    if not n.args or not isinstance(n.args[0], TensorRef):
        return None
    x = n.args[0].id
    if len(g.tensors[x].shape) != 2:
        return None
    if n.op == T:
        return x
    if n.op == "aten.transpose.int" and len(n.args) == 3 and {n.args[1] % 2, n.args[2] % 2} == {0, 1}:
        return x
    if n.op == "aten.permute.default" and [d % 2 for d in n.args[1]] == [1, 0]:
        return x
    return None


def _why_not_output(g: Graph, m: Matmul) -> str | None:
    """The matmul's output must be a storage it allocates, that nothing writes in place and
    whose every tensor is the output or a view of it (so all of them can follow it)."""
    meta = g.tensors[m.out]
    what = describe_node(g, m.node)
    if m.out in g.outputs:
        return f"its output {describe_tensor(g, m.out)} is a program output"
    if meta.storage in g.caller_held_storages() or g.storage_owner_of(meta.storage) != m.node:
        return f"the output of {what} lives in memory it does not allocate"
    written = writers_of(g, {meta.storage}).get(meta.storage)
    if written:
        return (f"{describe_node(g, written[0])} writes the output of {what} in place: it cannot "
                "become a view of a merged result")
    closure = view_closure(g, m.out)
    stray = [t.id for t in g.tensors.values() if t.storage == meta.storage and t.id not in closure]
    if stray:
        return (f"{describe_tensor(g, stray[0])} shares the storage of the output of {what} "
                "without being a view of it")
    return None


def view_closure(g: Graph, t: int) -> set[int]:
    """t and every tensor made from it by chains of view ops (same storage)."""
    from peakcut.transform.taso.edit import is_view_op

    storage = g.tensors[t].storage
    found = {t}
    stack = [t]
    while stack:
        x = stack.pop()
        for u in g.users(x):
            if not is_view_op(g.nodes[u].op):
                continue
            for y in g.nodes[u].output_ids():
                if g.tensors[y].storage == storage and y not in found:
                    found.add(y)
                    stack.append(y)
    return found


# ------------------------------------------------------------------ merge
ADD = "aten.add.Tensor"


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


def _sole_reader(g: Graph, t: int) -> int | None:
    readers = g.users(t)
    return readers[0] if len(readers) == 1 and t not in g.outputs else None


def _is_plain_add(g: Graph, nid: int) -> bool:
    n = g.nodes[nid]
    if n.op != ADD or len(n.args) != 2 or not all(isinstance(a, TensorRef) for a in n.args):
        return False
    if n.kwargs.get("alpha", 1) != 1 or n.args[0] == n.args[1]:
        return False
    out = g.tensors[n.outputs[0]]
    return all(g.tensors[a.id].shape == out.shape and g.tensors[a.id].dtype == out.dtype
               for a in n.args)


def _sum_tree(g: Graph, mms: Sequence[Matmul]) -> _SumTree | str:
    """The add tree summing the matmuls' outputs (see _SumTree), or why there is none."""
    from peakcut.transform.taso.edit import is_view_op

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
            up = _sole_reader(g, g.nodes[path[-1]].outputs[0])
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
    if first.op == ADDMM:
        if mode == "rows":
            return (f"{describe_node(g, first.node)} adds a bias: only bias-free matmuls that "
                    "share their right operand are merged")
        if len({(repr(m.beta), repr(m.alpha)) for m in mms}) != 1:
            return f"{describe_node(g, first.node)} and the others scale differently (beta/alpha)"
        for m, n in zip(mms, sizes, strict=True):
            bias = g.tensors[m.bias]
            if bias.shape != (n,) or bias.dtype != g.tensors[mms[0].bias].dtype:
                return (f"the bias {describe_tensor(g, m.bias)} of {describe_node(g, m.node)} is "
                        f"not a vector of its {n} output features")
    for m in mms:
        reason = _why_not_output(g, m)
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
    return MergePlan(mms, mode, sizes, tree)


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
    sources = [transposed_source(g, t) for t in tensors]
    kw = {"phase": like.phase, "module": like.module}

    def dense(ids: Sequence[int | None]) -> bool:
        return all(i is not None and is_contiguous(g.tensors[i].shape, g.tensors[i].stride)
                   for i in ids)

    if dense(sources) and not dense(tensors):
        cat = edit.add(CAT, ([TensorRef(s) for s in sources], 1 - dim), name=f"{name}_cat", **kw)
        return edit.add(T, (TensorRef(cat.outputs[0]),), name=name, **kw).outputs[0]
    return edit.add(CAT, ([TensorRef(t) for t in tensors], dim), name=name, **kw).outputs[0]


def merge_matmuls(g: Graph, order: Sequence[int], nodes: Sequence[int]) -> Rewrite:
    """One matmul over concatenated operands for the matmuls `nodes`.

    - they share their left operand ("cols", forward QKV): X @ cat(W_i, 1), split along dim 1;
    - they share their right operand ("rows", weight gradients): cat(G_i, 0) @ X, split along
      dim 0;
    - they share nothing but their results are summed ("sum", input gradients
      G_q @ W_q + G_k @ W_k + G_v @ W_v): cat(G_i, 1) @ cat(W_i, 0) replaces the sum; the
      tree of additions goes (its root keeps adding the one other tensor it added, if any).

    Split parts are views (aten.split_with_sizes); readers of the original results read them
    and views of them are re-derived. The merged node carries extra {'taso': {'rule':
    'merge_matmuls', 'mode': ..., 'sizes': [...], 'of': [names]}} (split_matmul un-merges
    it). Raises RuleError (the reason of why_not_merge_matmuls) when the rule does not apply.
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
    extra = {"mode": plan.mode, "sizes": list(plan.sizes), "of": names}
    kw = {"name": label, "phase": first.phase, "module": module, "extra": extra}
    principals = [m.node for m in mms]
    if plan.mode == "cols":
        b = _concat(edit, [m.b for m in mms], 1, f"{label}_rhs", like)
        if first.op == ADDMM:
            bias = edit.add(CAT, ([TensorRef(m.bias) for m in mms], 0), name=f"{label}_bias",
                            phase=first.phase, module=module).outputs[0]
            merged = edit.add(ADDMM, (TensorRef(bias), TensorRef(mms[0].a), TensorRef(b)),
                              {k: v for k, v in first.kwargs.items() if k in ("beta", "alpha")},
                              **kw)
        else:
            merged = edit.add(MM, (TensorRef(mms[0].a), TensorRef(b)), **kw)
        shape = "sharing their left operand"
    elif plan.mode == "rows":
        a = _concat(edit, [m.a for m in mms], 0, f"{label}_lhs", like)
        merged = edit.add(MM, (TensorRef(a), TensorRef(mms[0].b)), **kw)
        shape = "sharing their right operand"
    else:
        a = _concat(edit, [m.a for m in mms], 1, f"{label}_lhs", like)
        b = _concat(edit, [m.b for m in mms], 0, f"{label}_rhs", like)
        merged = edit.add(MM, (TensorRef(a), TensorRef(b)), **kw)
        shape = "whose results are summed"
    if plan.tree is None:
        dim = 1 if plan.mode == "cols" else 0
        split = edit.add(SPLIT, (TensorRef(merged.outputs[0]), list(plan.sizes), dim),
                         name=f"{label}_split", phase=first.phase, module=module,
                         multi_output=True)
        mapping = {m.out: part for m, part in zip(mms, split.outputs, strict=True)}
        users = edit.redirect(mapping)
        edit.rederive(users)
        tail = f"split {list(plan.sizes)} along dim {dim}"
    else:
        tree = plan.tree
        result = merged.outputs[0]
        if tree.views[0] is not None:
            v = g.nodes[tree.views[0]]
            result = edit.add(v.op, (TensorRef(result), *v.args[1:]), v.kwargs,
                              name=f"{label}_view", phase=first.phase, module=module).outputs[0]
        root = g.nodes[tree.root]
        if tree.rest is not None:
            edit.replace_args(root.id, (TensorRef(tree.rest), TensorRef(result)))
        else:
            users = edit.redirect({root.outputs[0]: result})
            edit.rederive(users)
            edit.remove(root.id, stand_ins=(merged.id,))
        for nid in reversed(tree.adds[:-1]):
            edit.remove(nid, stand_ins=(merged.id,))
        for nid in tree.views:
            if nid is not None:
                edit.remove(nid, stand_ins=(merged.id,))
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
    return edit.new.tensors[node.outputs[0]].shape


# ------------------------------------------------------------------ split / un-merge
@dataclass(frozen=True)
class _SplitPlan:
    mm: Matmul
    sizes: tuple[int, ...]
    unmerge: bool
    mode: str                  # "cols" | "rows" | "sum" (rows and sum only for un-merging)
    split_node: int | None     # the merged node's split, when un-merging


def near_equal_parts(n: int, k: int) -> tuple[int, ...]:
    return tuple(n // k + (1 if i < n % k else 0) for i in range(k))


def merged_info(g: Graph, nid: int) -> dict | None:
    info = g.nodes[nid].extra.get(TASO)
    return info if isinstance(info, dict) and info.get("rule") == "merge_matmuls" else None


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
        sizes = tuple(int(s) for s in info.get("sizes", ()))
        mode = info.get("mode")
        if mode not in ("cols", "rows", "sum") or len(sizes) < 2:
            return f"{what} carries a broken merge record {info}"
        reason = _why_not_output(g, m)
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
    reason = _why_not_output(g, m)
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
    kw = {"phase": like.phase, "module": like.module}

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
                                      name=f"{name}_{i}_slice", **kw).outputs[0])
                start += s
        return [_transpose_of(edit, x, f"{name}_{i}", like) for i, x in enumerate(found)]
    found = cat_parts(t, dim)
    if found is not None:
        return found
    out = []
    start = 0
    for i, s in enumerate(sizes):
        out.append(edit.add(SLICE, (TensorRef(t), dim, start, start + s), name=f"{name}_{i}",
                            **kw).outputs[0])
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
    return edit.add(T, (TensorRef(x),), name=name, phase=like.phase, module=like.module).outputs[0]


def _bias_pieces(edit: Edit, m: Matmul, sizes: Sequence[int], name: str, like: Node) -> list[int]:
    meta = edit.new.tensors[m.bias]
    if not meta.shape or meta.shape[-1] == 1 and sum(sizes) != 1:
        return [m.bias] * len(sizes)
    if len(meta.shape) == 1:
        return _pieces_1d(edit, m.bias, sizes, name, like)
    return _pieces(edit, m.bias, sizes, len(meta.shape) - 1, name, like)


def _pieces_1d(edit: Edit, t: int, sizes: Sequence[int], name: str, like: Node) -> list[int]:
    g = edit.new
    p = g.producer(t)
    if p is not None and g.nodes[p].op == CAT:
        n = g.nodes[p]
        ids = [r.id for r in n.args[0] if isinstance(r, TensorRef)]
        if len(ids) == len(n.args[0]) and [g.tensors[i].shape[0] for i in ids] == list(sizes):
            return ids
    out = []
    start = 0
    for i, s in enumerate(sizes):
        out.append(edit.add(SLICE, (TensorRef(t), 0, start, start + s), name=f"{name}_{i}",
                            phase=like.phase, module=like.module).outputs[0])
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
    base = {"phase": n.phase, "module": n.module}
    info = merged_info(g, node) or {}
    names = list(info.get("of", [])) if plan.unmerge else []
    if len(names) != k:
        names = [f"{label}_part{i}" for i in range(k)]
    if plan.mode == "cols":
        bs = _pieces(edit, m.b, plan.sizes, 1, f"{label}_rhs", like)
        biases = _bias_pieces(edit, m, plan.sizes, f"{label}_bias", like) if m.bias else None
        outs = []
        for i in range(k):
            if biases is not None:
                args = (TensorRef(biases[i]), TensorRef(m.a), TensorRef(bs[i]))
            else:
                args = (TensorRef(m.a), TensorRef(bs[i]))
            outs.append(edit.add(m.op, args, kwargs, name=names[i], **base,
                                 extra={"part": i, "of": label}))
    elif plan.mode == "rows":
        as_ = _pieces(edit, m.a, plan.sizes, 0, f"{label}_lhs", like)
        outs = [edit.add(MM, (TensorRef(as_[i]), TensorRef(m.b)), name=names[i], **base,
                         extra={"part": i, "of": label}) for i in range(k)]
    else:
        as_ = _pieces(edit, m.a, plan.sizes, 1, f"{label}_lhs", like)
        bs = _pieces(edit, m.b, plan.sizes, 0, f"{label}_rhs", like)
        outs = [edit.add(MM, (TensorRef(as_[i]), TensorRef(bs[i])), name=names[i], **base,
                         extra={"part": i, "of": label}) for i in range(k)]
    results = [o.outputs[0] for o in outs]
    if plan.mode == "sum":
        from peakcut.transform.taso.edit import is_view_op

        readers = g.users(m.out)
        target = m.out
        view = g.nodes[readers[0]] if len(readers) == 1 else None
        if view is not None and is_view_op(view.op) and len(view.output_ids()) == 1:
            results = [edit.add(view.op, (TensorRef(r), *view.args[1:]), view.kwargs,
                                name=f"{names[i]}_view", **base).outputs[0]
                       for i, r in enumerate(results)]
            target = view.output_ids()[0]
        else:
            view = None
        total = results[0]
        for i, r in enumerate(results[1:], 1):
            total = edit.add(ADD, (TensorRef(total), TensorRef(r)), name=f"{label}_sum{i}",
                             **base).outputs[0]
        users = edit.redirect({target: total})
        edit.rederive(users)
        if view is not None:
            edit.remove(view.id, stand_ins=tuple(o.id for o in outs))
        edit.remove(node, stand_ins=tuple(o.id for o in outs))
        what = (f"un-merge {describe_node(g, node)} into {k} matmuls ({', '.join(names)}) and "
                f"{k - 1} addition(s) of their results; readers {describe_users(g, users)}")
    elif plan.unmerge:
        sp = g.nodes[plan.split_node]
        users = edit.redirect(dict(zip(sp.output_ids(), results, strict=True)))
        edit.rederive(users)
        edit.remove(sp.id, stand_ins=tuple(o.id for o in outs))
        edit.remove(node, stand_ins=tuple(o.id for o in outs))
        what = (f"un-merge {describe_node(g, node)} into {k} matmuls "
                f"({', '.join(names)}) reading the pieces of its concatenated operand again; "
                f"readers {describe_users(g, users)}")
    else:
        cat = edit.add(CAT, ([TensorRef(r) for r in results], 1), name=f"{label}_cat", **base)
        users = edit.redirect({m.out: cat.outputs[0]})
        edit.rederive(users)
        edit.remove(node, stand_ins=(cat.id,))
        what = (f"split {describe_node(g, node)} along its {sum(plan.sizes)} output features "
                f"into {k} matmuls {list(plan.sizes)} and a cat: 1 matmul launch becomes {k}, "
                f"plus {len(edit.added) - k} slice/cat node(s)")
    edit.inherit.update({a: (node,) for a in edit.added})
    edit.remove_dead(p for t in n.input_ids() if (p := g.producer(t)) is not None)
    return edit.finish([node], what)
