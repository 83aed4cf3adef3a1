"""substitute: the value one node computes, computed instead by other ATen calls over tensors
the graph already holds (a substitution's destination graph). The readers of the node's
result read the new result; the node, and the nodes feeding only it, go.

The caller says what to compute (a generated substitution's destination as calls, its sites
found by peakcut.taso.match); this module only edits: it knows no substitution and proves
nothing. Each call is (ATen op, args): a tensor argument is a TensorRef of a tensor of the
graph or a Slot, the result of an earlier call (inside a list too, as cat takes its tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.ir.tensor import Role
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    check_order_matches,
    describe_node,
    describe_tensor,
    describe_users,
)
from peakcut.transform.taso.edit import Edit


@dataclass(frozen=True)
class Slot:
    """The result of the call at `index` of the same substitution."""

    index: int


Call = tuple[str, tuple[Any, ...]]


def _refs(value: Any) -> list[Any]:
    if isinstance(value, TensorRef | Slot):
        return [value]
    if isinstance(value, list | tuple):
        return [r for v in value for r in _refs(v)]
    return []


def _resolve(value: Any, made: Sequence[int]) -> Any:
    if isinstance(value, Slot):
        return TensorRef(made[value.index])
    if isinstance(value, list):
        return [_resolve(v, made) for v in value]
    if isinstance(value, tuple):
        return tuple(_resolve(v, made) for v in value)
    return value


def why_not_substitute(g: Graph, order: Sequence[int], node: int, calls: Sequence[Call],
                       result: TensorRef | Slot) -> str | None:
    """Why `node`'s result cannot be replaced by `result` of `calls` (None when it can)."""
    if node not in g.nodes:
        return f"node {node} is not in the graph"
    stale = check_order_matches(g, order)
    if stale:
        return stale
    outs = g.nodes[node].output_ids()
    if len(outs) != 1:
        return f"{describe_node(g, node)} does not make one tensor"
    out = outs[0]
    if out in g.outputs:
        return f"{describe_tensor(g, out)} is a program output"
    if g.tensors[out].role is not Role.ACTIVATION:
        return f"{describe_tensor(g, out)} is a {g.tensors[out].role.value} tensor, not a plain activation"
    for i, (_, args) in enumerate(calls):
        for r in _refs(args):
            if isinstance(r, Slot) and not 0 <= r.index < i:
                return f"call {i} reads the result of call {r.index}, which is not before it"
            if isinstance(r, TensorRef) and r.id not in g.tensors:
                return f"call {i} reads tensor {r.id}, which is not in the graph"
    if isinstance(result, Slot) and not 0 <= result.index < len(calls):
        return f"the result is call {result.index}, not one of the {len(calls)} calls"
    if isinstance(result, TensorRef) and (result.id not in g.tensors or result.id == out):
        return f"the result is tensor {result.id}: not another tensor of the graph"
    return None


def substitute(g: Graph, order: Sequence[int], node: int, calls: Sequence[Call],
               result: TensorRef | Slot, label: str = "substitute") -> Rewrite:
    """`node`'s readers read `result` of `calls` (added where `node` ran); `node` goes, and
    the nodes that fed only it. label: the rule named in the new nodes' tag."""
    why = why_not_substitute(g, order, node, calls, result)
    if why:
        raise RuleError(why)
    n = g.nodes[node]
    (out,) = n.output_ids()
    edit = Edit(g, order, label)
    made: list[int] = []
    for i, (aten, args) in enumerate(calls):
        new = edit.add(aten, _resolve(args, made), name=f"{n.name}_sub{i}", phase=n.phase,
                       module=n.module)
        made.append(new.output_ids()[0])
    target = made[result.index] if isinstance(result, Slot) else result.id
    users = edit.redirect({out: target})
    new_meta, old_meta = edit.new.tensors[target], g.tensors[out]
    if (new_meta.shape, new_meta.dtype) != (old_meta.shape, old_meta.dtype):
        raise RuleError(f"{describe_tensor(g, out)} would be read as {describe_tensor(edit.new, target)}: "
                        "another shape or dtype")
    if (new_meta.stride, new_meta.storage_offset) != (old_meta.stride, old_meta.storage_offset):
        edit.rederive(users)
    feeders = [g.producer(t) for t in n.input_ids()]
    added = [p for p in (edit.new.producer(t) for t in made) if p is not None]
    edit.remove(node, stand_ins=(*added, *users))
    edit.remove_dead([f for f in feeders if f is not None])
    return edit.finish([node], (
        f"{label}: {describe_node(g, node)} computed as {len(calls)} call(s); "
        f"{describe_users(g, users) or 'nobody'} read {describe_tensor(edit.new, target)}; "
        f"{len(edit.removed)} node(s) removed"))
