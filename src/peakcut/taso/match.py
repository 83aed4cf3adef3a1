"""Where a generated substitution's source graph occurs in a captured Graph: its sites.

A node of the Graph reads as a vocabulary op (`classify`) when its ATen op and arguments are
those of the op: mm, add / sub / mul of two tensors (no alpha), neg, relu, gelu (exact), a
2-D transpose, cat of two tensors, a slice of the first part or the rest of a dim, sum over
one dim with keepdim, softmax. A rule's source term matches at a tensor when the producers
read as the term's ops, one graph tensor stands for each input name, every tensor is 2-D of
one floating dtype, and the symbolic shapes bind to the real sizes: each size term (m, n, k)
one size, "1" size 1, and a slice cuts where the concatenated dim's first part ends.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.taso.ops import Shape, dim_size
from peakcut.taso.ruleset import Rule
from peakcut.taso.term import Term, is_input, shape_of

_BINARY = {"aten.add.Tensor": "add", "aten.sub.Tensor": "sub", "aten.mul.Tensor": "mul",
           "aten.mm.default": "mm"}
_UNARY = {"aten.neg.default": "neg", "aten.relu.default": "relu", "aten.gelu.default": "gelu",
          "aten.t.default": "t"}
_FLOATING = ("float16", "bfloat16", "float32", "float64")


@dataclass(frozen=True)
class Match:
    """A site of `rule`: its source computes tensor `root`; `nodes` the matched nodes (root's
    producer first), `inputs` the tensor each input name stands for, `sizes` the size of each
    size term, `shared` the matched nodes besides the root's producer that others also read
    (they stay when the source is replaced)."""

    rule: str
    root: int
    nodes: tuple[int, ...]
    inputs: Mapping[str, int]
    sizes: Mapping[str, int]
    shared: tuple[int, ...]


def _tensor(arg: object) -> int | None:
    return arg.id if isinstance(arg, TensorRef) else None


def classify(g: Graph, nid: int) -> tuple[str, tuple[int, ...]] | None:
    """(vocabulary op key, the tensors it reads) of node `nid`, or None when it is no op of the
    vocabulary (or has arguments the vocabulary does not model)."""
    n = g.nodes[nid]
    args, op = n.args, n.op
    if len(n.output_ids()) != 1:
        return None
    if op in _BINARY:
        ts = tuple(_tensor(a) for a in args[:2])
        if len(args) != 2 or None in ts or (n.kwargs.get("alpha", 1) != 1):
            return None
        return _BINARY[op], ts  # type: ignore[return-value]
    x = _tensor(args[0]) if args else None
    if op == "aten.cat.default" and args and isinstance(args[0], list | tuple):
        ts = tuple(_tensor(a) for a in args[0])
        dim = args[1] if len(args) > 1 else n.kwargs.get("dim", 0)
        if len(ts) != 2 or None in ts or not isinstance(dim, int):
            return None
        return f"cat{dim % 2}", ts  # type: ignore[return-value]
    if x is None or len(g.tensors[x].shape) != 2:
        return None
    if op in _UNARY and len(args) == 1:
        if op == "aten.gelu.default" and n.kwargs.get("approximate", "none") != "none":
            return None
        return _UNARY[op], (x,)
    if op == "aten.transpose.int" and len(args) == 3 and {args[1] % 2, args[2] % 2} == {0, 1}:
        return "t", (x,)
    if op == "aten.sum.dim_IntList" and len(args) >= 3 and args[2] is True \
            and isinstance(args[1], list | tuple) and len(args[1]) == 1:
        return f"sum{args[1][0] % 2}", (x,)
    if op == "aten._softmax.default" and len(args) == 3 and args[2] is False:
        return f"softmax{args[1] % 2}", (x,)
    if op == "aten.slice.Tensor" and len(args) >= 4 and (len(args) < 5 or args[4] == 1):
        dim, start, end = args[1] % 2, args[2], args[3]
        size = g.tensors[x].shape[dim]
        if start == 0 and end < size:
            return f"slice{dim}a", (x,)
        if 0 < start < size and end >= size:
            return f"slice{dim}b", (x,)
    return None


Kinds = dict[int, "tuple[str, tuple[int, ...]] | None"]


def _kind(g: Graph, nid: int, kinds: Kinds | None) -> tuple[str, tuple[int, ...]] | None:
    """classify(g, nid), remembered in `kinds` (one scan's memo) when given."""
    if kinds is None:
        return classify(g, nid)
    if nid not in kinds:
        kinds[nid] = classify(g, nid)
    return kinds[nid]


class _Matcher:
    def __init__(self, g: Graph, rule: Rule, kinds: Kinds | None = None) -> None:
        self.g, self.rule, self.kinds = g, rule, kinds
        self.env: dict[str, int] = {}
        self.seen: dict[Term, int] = {}          # term -> tensor it matched
        self.nodes: list[int] = []

    def term(self, t: Term, tensor: int) -> bool:
        if t in self.seen:
            return self.seen[t] == tensor
        if is_input(t):
            if self.env.setdefault(t[1], tensor) != tensor:
                return False
            self.seen[t] = tensor
            return True
        p = self.g.producer(tensor)
        got = _kind(self.g, p, self.kinds) if p is not None else None
        if got is None or got[0] != t[0] or len(got[1]) != len(t) - 1:
            return False
        self.seen[t] = tensor
        self.nodes.append(p)  # type: ignore[arg-type]
        return all(self.term(a, x) for a, x in zip(t[1:], got[1], strict=True))

    def sizes(self) -> dict[str, int] | None:
        sizes: dict[str, int] = {}
        for name, tensor in self.env.items():
            real = self.g.tensors[tensor].shape
            if len(real) != 2:
                return None
            for dim, size in zip(self.rule.inputs[name], real, strict=True):
                if len(dim) != 1:
                    return None
                term = dim[0]
                want = 1 if term == "1" else sizes.setdefault(term, size)
                if want != size:
                    return None
        return sizes

    def shapes_fit(self, sizes: Mapping[str, int]) -> bool:
        memo: dict[Term, Shape | None] = {}
        dtypes = {str(self.g.tensors[x].dtype).replace("torch.", "") for x in self.seen.values()}
        if len(dtypes) != 1 or dtypes.pop() not in _FLOATING:
            return False
        for t, tensor in self.seen.items():
            shape = shape_of(t, self.rule.inputs, memo)
            if shape is None or tuple(dim_size(d, sizes) for d in shape) != tuple(self.g.tensors[tensor].shape):
                return False
            if not is_input(t) and t[0].startswith("slice"):
                dim = int(t[0][5])
                arg = shape_of(t[1], self.rule.inputs, memo)
                cut = dim_size(arg[dim][:1], sizes) if arg else -1
                args = self.g.nodes[self.g.producer(tensor)].args  # type: ignore[index]
                if (args[3] if t[0].endswith("a") else args[2]) != cut:
                    return False
        return True


def match(g: Graph, rule: Rule, tensor: int, kinds: Kinds | None = None) -> Match | None:
    """The site of `rule` whose source computes `tensor`, or None. `kinds`: a memo of
    classify's answers by node, shared by the matches of one scan of an unchanged graph."""
    m = _Matcher(g, rule, kinds)
    if is_input(rule.src) or not m.term(rule.src, tensor):
        return None
    sizes = m.sizes()
    if sizes is None or not m.shapes_fit(sizes):
        return None
    inner = set(m.nodes[1:])
    shared = tuple(n for n in m.nodes[1:]
                   if any(u not in inner and u != m.nodes[0]
                          for t in g.nodes[n].output_ids() for u in g.users(t)))
    return Match(rule.name, tensor, tuple(m.nodes), dict(m.env), sizes, shared)


def _child_keys(t: Term) -> tuple[str | None, ...]:
    """The vocabulary op of each argument of term t (None: an input, which matches anything)."""
    return tuple(None if is_input(a) else a[0] for a in t[1:])


class RuleIndex:
    """Rules by their source's op and its arguments' ops, and each rule's position in the
    order given: built once for a rule set, read by every scan of find_matches."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = tuple(rules)
        self.by_key: dict[tuple[str, tuple[str | None, ...]], list[tuple[int, Rule]]] = {}
        for i, r in enumerate(self.rules):
            if not is_input(r.src):
                self.by_key.setdefault((r.src[0], _child_keys(r.src)), []).append((i, r))
        self.position = {r.name: i for i, r in enumerate(self.rules)}


def _candidates(index: Mapping[tuple[str, tuple[str | None, ...]], list[tuple[int, Rule]]], key: str,
                children: tuple[str | None, ...]) -> list[tuple[int, Rule]]:
    """The rules (with their positions) whose source could match at a node read as `key` over
    arguments whose producers read as `children`: each argument term an input or the
    producer's op."""
    found: list[tuple[int, Rule]] = []
    for mask in range(1 << len(children)):
        keys = tuple(None if mask >> i & 1 else c for i, c in enumerate(children))
        if mask and any(c is None for i, c in enumerate(children) if mask >> i & 1):
            continue       # the same key as a smaller mask's
        found.extend(index.get((key, keys), ()))
    return found


def find_matches(g: Graph, rules: Sequence[Rule] | RuleIndex, order: Iterable[int] | None = None) -> list[Match]:
    """Every site of every rule in g, by node in `order` (g.order by default), then rule (in
    the order of `rules` among those whose source's top two levels fit the node's)."""
    index = rules if isinstance(rules, RuleIndex) else RuleIndex(rules)
    kinds: Kinds = {}
    found = []
    for nid in g.order if order is None else order:
        got = _kind(g, nid, kinds)
        if got is None:
            continue
        (out,) = g.nodes[nid].output_ids()
        children = []
        for t in got[1]:
            p = g.producer(t)
            sub = _kind(g, p, kinds) if p is not None else None
            children.append(None if sub is None else sub[0])
        for _, r in sorted(_candidates(index.by_key, got[0], tuple(children)), key=lambda pr: pr[0]):
            m = match(g, r, out, kinds)
            if m is not None:
                found.append(m)
    return found
