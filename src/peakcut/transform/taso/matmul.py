"""The matmul anatomy shared by the TASO matmul rules (matmul_merge.py, matmul_split.py).

parse_matmul reads an aten.mm / aten.addmm node into its operands (out = beta * bias +
alpha * a @ b); transposed_source sees through a 2-D transpose (weights reach addmm as t(W));
why_not_output says whether a matmul's result can become (or stop being) a view of another
matmul's result; view_closure lists a tensor and its views.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.ir.registry import bind_arguments
from peakcut.transform.rewrite import describe_node, describe_tensor, writers_of
from peakcut.transform.taso.edit import is_view_op

MM = "aten.mm.default"
ADDMM = "aten.addmm.default"
CAT = "aten.cat.default"
SPLIT = "aten.split_with_sizes.default"
SLICE = "aten.slice.Tensor"
T = "aten.t.default"
ADD = "aten.add.Tensor"
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


def why_not_output(g: Graph, m: Matmul) -> str | None:
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
