"""The code of torch.optim's list ops: a run of per-tensor calls written back as one list call.

Capture records each foreach or fused op of the update as one node per tensor, each tagged
with the list op it is a share of (ir.foreach.ForeachTag). A run of such nodes that stand one
after another in the program's order, outside every fission loop, untouched by rules (no tag
but their foreach tag and capture's fake dtypes), with calls that fit one list call, is
written as that call:

    torch._foreach_lerp_([s_w_exp_avg, s_b_exp_avg], [g_w, g_b], hp['g0:one_minus_beta1'])
    lerp_, lerp__1 = s_w_exp_avg, s_b_exp_avg     # the in-place results' names, where read

Per argument of the per-tensor call: tensors become lists (one tensor shared by every call
stays one tensor: `_foreach_mul_(grads, clip_coef)`), one-tensor lists are joined (the fused
kernel's), a scalar the same in every call stays one scalar and differing scalars become a
scalar list (Adam's per-parameter step sizes: the list op's ScalarList overload; a `value=`
keyword that differs is passed so, positionally). A call that does not fit ends the run there;
every node outside a run is written alone, as an ordinary ATen call. A list op is element-wise
per tensor, so both give the same numbers. The run's call stands where its last node stands;
the tensors its earlier nodes free are deleted after it.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import Any

from peakcut.codegen.calls import literal
from peakcut.codegen.hooks import CodeHook, Names, NodeCode
from peakcut.ir.foreach import ForeachTag
from peakcut.ir.graph import Graph
from peakcut.ir.node import Hyper, Node, TensorRef
from peakcut.ir.tags import FissionTag

_PLAIN_KINDS = frozenset({"foreach", "fake_dtypes"})
"""Tags a node in a run may carry: any other means a rule made or changed it."""

_SCALAR_LIST_KEYWORDS = frozenset({"value"})
"""Keywords whose differing values the list op takes as a positional scalar list."""


def _key(v: Any) -> Any:
    """What makes two scalar arguments the same argument (a run-time scalar by its name)."""
    return ("hp", v.name) if isinstance(v, Hyper) else (type(v).__name__, repr(v))


def _tag(g: Graph, nid: int) -> ForeachTag | None:
    node = g.nodes[nid]
    tag = node.tags.get(ForeachTag)
    if tag is None or node.tags.on_host or any(t.kind not in _PLAIN_KINDS for t in node.tags):
        return None
    return tag


def _fits(first: Node, node: Node) -> bool:
    """Whether `node` can join a list call whose first per-tensor call is `first`."""
    if node.op != first.op or len(node.args) != len(first.args) or node.kwargs.keys() != first.kwargs.keys():
        return False
    for a, b in zip(first.args, node.args, strict=True):
        if isinstance(a, TensorRef) != isinstance(b, TensorRef) or isinstance(a, list) != isinstance(b, list):
            return False
    for k, a in first.kwargs.items():
        b = node.kwargs[k]
        if isinstance(a, (TensorRef, list)) or isinstance(b, (TensorRef, list)):
            return False
        if _key(a) != _key(b) and k not in _SCALAR_LIST_KEYWORDS:
            return False
    return True


def find_runs(g: Graph, order: Sequence[int]) -> list[list[int]]:
    """The runs of two or more nodes written as one list call (module doc), in order."""
    regions = [i for i, nid in enumerate(order) if g.nodes[nid].tags.get(FissionTag) is not None]
    lo, hi = (regions[0], regions[-1]) if regions else (len(order), -1)
    runs: list[list[int]] = []
    current: list[int] = []
    current_tag: ForeachTag | None = None
    for i, nid in enumerate(order):
        tag = None if lo <= i <= hi else _tag(g, nid)
        if (tag is not None and current_tag is not None and (tag.run, tag.op) == (current_tag.run, current_tag.op)
                and _fits(g.nodes[current[0]], g.nodes[nid])):
            current.append(nid)
            continue
        if len(current) > 1:
            runs.append(current)
        current, current_tag = ([nid], tag) if tag is not None else ([], None)
    if len(current) > 1:
        runs.append(current)
    return runs


class ForeachCode(NodeCode):
    """The list calls of one program: each run written at its last node."""

    def __init__(self, g: Graph, order: Sequence[int], names: Names, runs: list[list[int]]) -> None:
        self.g = g
        self.names = names
        self.last: dict[int, list[int]] = {run[-1]: run for run in runs}
        self.quiet = {nid for run in runs for nid in run[:-1]}
        last_use: dict[int, int] = {}
        for nid in order:
            node = g.nodes[nid]
            for t in (*node.output_ids(), *node.input_ids()):
                last_use[t] = nid
        kept = set(g.outputs)
        # results of in-place shares nothing reads: never named, never deleted
        self.unnamed = {o for run in runs for nid in run for o in g.nodes[nid].output_ids()
                        if o not in kept and not g.users(o)}
        self.deferred: dict[int, list[int]] = {}     # a run's last node -> what its earlier nodes free
        for run in runs:
            members = set(run[:-1])
            self.deferred[run[-1]] = [t for t, nid in last_use.items()
                                      if nid in members and t not in kept and t not in self.unnamed]
        self._kept = {t for ts in self.deferred.values() for t in ts} | self.unnamed

    def keeps(self, tensor: int) -> bool:
        return tensor in self._kept

    def emit(self, node: Node) -> list[str] | None:
        if node.id in self.quiet:
            return []
        run = self.last.get(node.id)
        if run is None:
            return None
        lines = list_call(self.g, run, self.names, self.unnamed)
        freed = self.deferred.get(node.id)
        if freed:
            lines.append("    del " + ", ".join(self.names.by_tensor[t] for t in freed))
        return lines


def list_call(g: Graph, run: Sequence[int], names: Names, unnamed: Set[int] = frozenset()) -> list[str]:
    """The lines of one list call for the nodes of `run` (module doc), at the body's top level;
    `unnamed`: in-place results nothing reads (not named after the call)."""
    nodes = [g.nodes[nid] for nid in run]
    first = nodes[0]
    tag = first.tags.get(ForeachTag)
    if tag is None:
        raise ValueError(f"internal: node {first.id} has no foreach tag")
    by = names.by_tensor
    device = g.device

    def join(values: list[Any]) -> str:
        if all(isinstance(v, TensorRef) for v in values):
            if len({v.id for v in values}) == 1:
                return by[values[0].id]
            return "[" + ", ".join(by[v.id] for v in values) + "]"
        if all(isinstance(v, list) for v in values):
            return "[" + ", ".join(literal(x, by, device) for v in values for x in v) + "]"
        if len({_key(v) for v in values}) == 1:
            return literal(values[0], by, device)
        return "[" + ", ".join(literal(v, by, device) for v in values) + "]"

    parts = [join([n.args[i] for n in nodes]) for i in range(len(first.args))]
    for k in first.kwargs:
        values = [n.kwargs[k] for n in nodes]
        if len({_key(v) for v in values}) == 1:
            parts.append(f"{k}={literal(values[0], by, device)}")
        else:
            parts.append(join(values))      # the ScalarList overload's positional scalars
    call = f"torch.{tag.op}({', '.join(parts)})"
    outs = [o for n in nodes for o in n.outputs]
    pad = "    "
    if tag.op.endswith("_"):        # in place: the call returns nothing; the results are its first list
        lines = [f"{pad}{call}"]
        named = [(by[o], literal(n.args[0], by, device)) for n in nodes for o in n.outputs
                 if o is not None and o not in unnamed]
        if named:
            lines.append(f"{pad}{', '.join(a for a, _ in named)} = {', '.join(b for _, b in named)}")
        return lines
    if any(o is None for o in outs):
        raise ValueError(f"internal: list op {tag.op} with a result not asked for")
    return [f"{pad}{', '.join(by[o] for o in outs if o is not None)}, = {call}"]


class ForeachHook(CodeHook):
    """Writes runs of list-op shares as one list call each (module doc)."""

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        runs = find_runs(g, order)
        return ForeachCode(g, order, names, runs) if runs else None
