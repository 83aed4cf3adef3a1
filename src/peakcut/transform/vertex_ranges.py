"""Aggregations over a graph's edges run in parts, a range of edges at a time.

A GNN layer gathers vertex rows by edge, computes per-edge messages and sums them into
vertices (``z.index_select(0, src) * w`` then ``out.index_add_(0, dst, messages)``, and in
the backward ``g.index_select(0, dst) * w`` summed into sources with ``index_add``). The
messages are ``edges x width``: at Reddit's size one such tensor is 117 GB. An *edge chain* is
such a sum (the sink: ``index_add``/``index_add_`` along dim 0) with every op before it whose
outputs are per-edge (leading dim E) and read only inside the chain: ``index_select`` along
dim 0 by an [E] index, element-wise ops, ``expand``/``view``/``unsqueeze`` that keep dim 0.

Split into n parts, part k runs the chain on the edges ``[k E / n, (k + 1) E / n)``: the
per-edge tensors from outside the chain (the index, an edge weight, the gathered rows'
index) are sliced (views, no copy), the rows gathered are read whole, and the part adds its
messages into the sum the part before left (part 0 runs the sink's own op, the others
``index_add_`` in place). The zeros the sum starts from (a ``new_zeros`` only the sum reads)
run right before part 0's sum, so they are not allocated across part 0's messages. The sum
is over the same edges in the same order, so the result is eager's: ``index_add_`` adds
one edge after another on the CPU, and the parts add the same edges in the same order (on a
GPU the atomics' order is not fixed, as in eager). The boundaries are a function of E, a
shape, so a plan holds for every edge list of that length; where the edges are grouped by
destination (ROC, the GNN workloads), a part is a range of destination vertices in the
forward, the vertices at the n - 1 boundaries shared by two parts. The new nodes carry a
VertexRangeTag (part, parts); their chains are not split again. A caller may give the parts'
edge offsets instead (``boundaries``: 0, the n - 1 split points, E; a balanced vertex
partition's, peakcut.roc): the parts still add the same edges in the same order, so the
result is eager's whatever the offsets, but the plan then holds the balance of the edge list
it was made for. A caller that knows the edge list may also say how many distinct rows each
part's index names (``named_rows``, by the sink's index tensor: a part of edges grouped by
destination names its vertices only): the parts' in-place sums carry it (NamedRowsTag) and are
priced at those rows, where the cost model would otherwise count every row their index could
name; the program and its numbers do not change.

Refused (naming the node): a sink along another dim, an index or messages whose length is
not the same E, fewer edges than parts, a chain node with control edges, a sum read as a
program output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.infer import InferenceError
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.tags import NamedRowsTag, NodeTags, Tag
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    check_order_matches,
    describe_node,
    describe_tensor,
)

SINKS = ("aten.index_add_.default", "aten.index_add.default")
GATHER = "aten.index_select.default"
_ELEMENTWISE = frozenset(f"aten.{op}" for op in (
    "mul.Tensor", "add.Tensor", "sub.Tensor", "div.Tensor", "mul.Scalar", "add.Scalar", "div.Scalar",
    "neg.default", "exp.default", "relu.default", "leaky_relu.default", "sigmoid.default", "tanh.default"))
_SHAPED = frozenset(("aten.expand.default", "aten.view.default", "aten.reshape.default", "aten._unsafe_view.default"))
_TEMPLATES = frozenset(("aten.new_zeros.default", "aten.new_empty.default"))


@dataclass(frozen=True, slots=True)
class VertexRangeTag(Tag):
    """A node of part `part` (of `parts`) of a split edge chain."""

    kind: ClassVar[str] = "vertex_range"
    part: int
    parts: int

    def to_json(self) -> list[int]:
        return [self.part, self.parts]

    @classmethod
    def from_json(cls, doc: Any) -> VertexRangeTag:
        return cls(int(doc[0]), int(doc[1]))


@dataclass(frozen=True)
class EdgeChain:
    """An index_add over E edges (`sink`) and the per-edge ops before it (`nodes`, graph order,
    the sink last)."""

    sink: int
    nodes: tuple[int, ...]
    edges: int


def _edge_tensor(g: Graph, tid: int, edges: int) -> bool:
    shape = g.tensors[tid].shape
    return len(shape) >= 1 and shape[0] == edges


def _keeps_edge_dim(g: Graph, node: Node, edges: int) -> bool:
    """The op maps rows to rows along dim 0 over `edges` rows (module doc)."""
    outs = node.output_ids()
    if len(outs) != 1 or not _edge_tensor(g, outs[0], edges) or node.mutated_ids():
        return False
    if node.op == GATHER:
        return node.args[1] == 0 and isinstance(node.args[2], TensorRef) and \
            g.tensors[node.args[2].id].shape == (edges,)
    rank = len(g.tensors[outs[0]].shape)
    if node.op == "aten.unsqueeze.default":
        dim = node.args[1] if node.args[1] >= 0 else node.args[1] + rank
        return dim >= 1 and isinstance(node.args[0], TensorRef) and _edge_tensor(g, node.args[0].id, edges)
    if node.op in _SHAPED:
        return isinstance(node.args[0], TensorRef) and _edge_tensor(g, node.args[0].id, edges)
    return node.op in _ELEMENTWISE


def _edge_args(g: Graph, node: Node, edges: int) -> list[int]:
    """The positions of `node`'s per-edge tensor arguments, those a part slices or takes from
    the part before: the index and messages of a sum, the index of a gather, the input of a
    shape op, and the full-rank operands of an element-wise op."""
    if node.op in SINKS:
        return [2, 3]
    if node.op == GATHER:
        return [2]
    if node.op == "aten.unsqueeze.default" or node.op in _SHAPED:
        return [0]
    rank = len(g.tensors[node.output_ids()[0]].shape)
    return [j for j, a in enumerate(node.args) if isinstance(a, TensorRef)
            and len(g.tensors[a.id].shape) == rank and _edge_tensor(g, a.id, edges)]


def _chain(g: Graph, sink: Node, edges: int) -> tuple[int, ...]:
    """The sink and the ops before it that only the chain reads (module doc); an index is
    sliced, never made per part."""
    inside = {sink.id}
    grew = True
    while grew:
        grew = False
        for nid in list(inside):
            node = g.nodes[nid]
            for j in _edge_args(g, node, edges):
                p = g.producer(node.args[j].id)
                if p is None or p in inside or node.op in SINKS + (GATHER,) and j == 2:
                    continue
                prod = g.nodes[p]
                if not _keeps_edge_dim(g, prod, edges) or any(t in g.outputs for t in prod.output_ids()):
                    continue
                users = {u for t in prod.output_ids() for u in g.users(t)}
                if all(u in inside or g.nodes[u].op in _TEMPLATES for u in users):
                    inside.add(p)
                    grew = True
    return tuple(v for v in g.order if v in inside)


def find_edge_chains(g: Graph) -> list[EdgeChain]:
    """Every index_add over per-edge messages in g not already split, in order, with its chain."""
    found = []
    for nid in g.order:
        node = g.nodes[nid]
        if node.op not in SINKS or node.tags.get(VertexRangeTag) is not None or len(node.args) < 4:
            continue
        msg = node.args[3]
        if not isinstance(msg, TensorRef):
            continue
        edges = g.tensors[msg.id].shape[0] if g.tensors[msg.id].shape else 0
        found.append(EdgeChain(nid, _chain(g, node, edges), edges))
    return found


def why_not_split(g: Graph, chain: EdgeChain, parts: int) -> str | None:
    """Why `chain` cannot run in `parts` parts (None when it can)."""
    sink = g.nodes.get(chain.sink)
    if sink is None or sink.op not in SINKS:
        return f"node {chain.sink} is not an index_add of this graph"
    what = describe_node(g, chain.sink)
    if parts < 2:
        return f"parts={parts}: a split needs at least 2 parts"
    if sink.args[1] != 0:
        return f"{what} sums along dim {sink.args[1]}: only sums over edges along dim 0 split"
    index, msg = sink.args[2], sink.args[3]
    if not (isinstance(index, TensorRef) and isinstance(msg, TensorRef)) or \
            g.tensors[index.id].shape != (chain.edges,) or not _edge_tensor(g, msg.id, chain.edges):
        return f"{what}: its index and messages are not both {chain.edges} edges long"
    if chain.edges < parts:
        return f"{what} sums {chain.edges} edges: fewer than {parts} parts"
    if len(chain.nodes) < 2:
        return (f"{what} sums {describe_tensor(g, msg.id)}, made by an op the split does not cross or read "
                "outside the sum: nothing per edge to split")
    if chain.sink in g.control or any(v in g.control or any(v in c for c in g.control.values())
                                      for v in chain.nodes[:-1]):
        return f"{what}: a node of its chain has control edges (only nodes after its sum may have)"
    if any(t in g.outputs for t in sink.output_ids()):
        return f"{what}: its sum is a program output"
    for u, t in _template_readers(g, chain):
        if _template_source(g, chain, t) is None:
            return (f"{describe_node(g, u)} takes its dtype from a per-edge tensor of {what}'s chain, and the "
                    "chain reads no other tensor of that dtype to take it from")
    return None


def _template_readers(g: Graph, chain: EdgeChain) -> list[tuple[int, int]]:
    """(node, tensor): the nodes outside the chain that read a chain tensor only for its dtype
    and device (new_zeros)."""
    return [(u, t) for v in chain.nodes for t in g.nodes[v].output_ids() for u in g.users(t)
            if u not in chain.nodes and g.nodes[u].op in _TEMPLATES]


def _template_source(g: Graph, chain: EdgeChain, tensor: int) -> int | None:
    """A tensor the chain reads from outside it, of `tensor`'s dtype, for a new_zeros to take
    its dtype and device from in place of `tensor` (which the split removes)."""
    inside = {t for v in chain.nodes for t in g.nodes[v].output_ids()}
    dtype = g.tensors[tensor].dtype
    for v in chain.nodes:
        for t in g.nodes[v].input_tuple:
            if t not in inside and g.tensors[t].dtype == dtype:
                return t
    return None


def _only_for(g: Graph, node: int, sink: int) -> bool:
    """True when the sink alone reads `node`'s outputs and no control edge involves `node`:
    then it may run right before the first part's sum (its zeros allocated when first needed)."""
    return (all(g.users(t) == [sink] for t in g.nodes[node].output_ids()) and node not in g.control
            and not any(node in preds for preds in g.control.values()))


def _part_arg(node: Node, j: int, arg: Any, edge_args: Sequence[int], mapped: Mapping[int, TensorRef],
              sliced: Mapping[int, TensorRef], edges: int, rows: int) -> Any:
    """Argument j of `node` in a part of `rows` edges."""
    if j in edge_args:
        return mapped[arg.id] if arg.id in mapped else sliced[arg.id]
    if node.op in _SHAPED and j == 1 and isinstance(arg, (list, tuple)) and arg and arg[0] == edges:
        return [rows, *arg[1:]]
    return arg


def _outside_edge_inputs(g: Graph, chain: EdgeChain) -> list[int]:
    """The per-edge tensors the chain reads from outside it, to slice per part."""
    inside = {t for v in chain.nodes for t in g.nodes[v].output_ids()}
    found: dict[int, None] = {}
    for v in chain.nodes:
        node = g.nodes[v]
        for j in _edge_args(g, node, chain.edges):
            if node.args[j].id not in inside:
                found[node.args[j].id] = None
    return list(found)


def edge_ranges(edges: int, parts: int, boundaries: Sequence[int] | None = None) -> tuple[int, ...]:
    """The parts' edge offsets (parts + 1 of them, 0 first, `edges` last): equal ranges, or
    `boundaries` checked (strictly increasing, so every part has an edge)."""
    if boundaries is None:
        return tuple(k * edges // parts for k in range(parts + 1))
    offsets = tuple(int(b) for b in boundaries)
    if len(offsets) != parts + 1 or offsets[0] != 0 or offsets[-1] != edges:
        raise ValueError(f"boundaries: {parts + 1} edge offsets from 0 to {edges} expected for {parts} parts, "
                         f"got {len(offsets)} from {offsets[0] if offsets else None} to "
                         f"{offsets[-1] if offsets else None}")
    if any(b >= c for b, c in zip(offsets, offsets[1:], strict=False)):
        raise ValueError(f"boundaries: edge offsets must increase strictly (every part an edge), got {offsets}")
    return offsets


def _split_one(edit: GraphEditor, g: Graph, chain: EdgeChain, parts: int,
               offsets: Sequence[int], rows: Sequence[int] | None = None) -> tuple[list[int], int]:
    """The part nodes of `chain` (in run order, part k on edges offsets[k] .. offsets[k + 1])
    and the tensor that holds the sum at the end; `rows`: the rows each part's index names
    (its sum's NamedRowsTag)."""
    sink = g.nodes[chain.sink]
    outside = _outside_edge_inputs(g, chain)
    added: list[int] = []
    acc: TensorRef = sink.args[0]
    for k in range(parts):
        lo, hi = offsets[k], offsets[k + 1]
        tags = NodeTags(VertexRangeTag(k, parts))

        def add(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], base: Node, name: str,
                tags: NodeTags = tags) -> TensorRef:
            node = edit.add_op(op, args, kwargs, name=name, phase=base.phase,
                               module=base.module, tags=tags)
            added.append(node.id)
            return TensorRef(node.output_ids()[0])

        sliced = {t: add("aten.slice.Tensor", (TensorRef(t), 0, lo, hi), {}, sink, f"{g.tensors[t].name}_part{k}")
                  for t in outside}
        mapped: dict[int, TensorRef] = {}
        for v in chain.nodes[:-1]:
            node = g.nodes[v]
            edge_args = _edge_args(g, node, chain.edges)
            args = tuple(_part_arg(node, j, a, edge_args, mapped, sliced, chain.edges, hi - lo)
                         for j, a in enumerate(node.args))
            mapped[node.output_ids()[0]] = add(node.op, args, dict(node.kwargs), node, f"{node.name}_part{k}")
        msg = mapped.get(sink.args[3].id, sliced.get(sink.args[3].id))
        if msg is None:
            raise GraphError(f"{describe_node(g, sink.id)}: its messages are neither made nor sliced per part")
        op = sink.op if k == 0 else "aten.index_add_.default"
        sum_tags = tags if rows is None else tags.with_tag(NamedRowsTag(int(rows[k])))
        acc = add(op, (acc, 0, sliced[sink.args[2].id], msg), dict(sink.kwargs), sink, f"{sink.name}_part{k}",
                  sum_tags)
    return added, acc.id


def split_edge_chains(g: Graph, order: Sequence[int], chains: Sequence[EdgeChain], parts: int,
                      boundaries: Sequence[int] | None = None,
                      named_rows: Mapping[int, Sequence[int]] | None = None) -> tuple[Rewrite | None, list[str | None]]:
    """Every chain that can be split, split into `parts` parts in one edit; the reason per chain
    (None: done). The Rewrite is None when none could. `boundaries`: the parts' edge offsets
    (edge_ranges), the same for every chain; a chain of another length is not split.
    `named_rows`: by index tensor, the distinct rows each part of that index names (module
    doc), for the chains whose sum that tensor indexes."""
    stale = check_order_matches(g, order)
    if stale:
        return None, [stale] * len(chains)
    if boundaries is not None:
        edge_ranges(int(boundaries[-1]) if len(boundaries) else 0, parts, boundaries)
    indexes = {c.sink: g.nodes[c.sink].args[2] for c in chains if c.sink in g.nodes and len(g.nodes[c.sink].args) > 2}
    for t, counts in (named_rows or {}).items():
        if not any(isinstance(i, TensorRef) and i.id == t for i in indexes.values()):
            raise ValueError(f"named_rows: tensor {t} is the index of none of the chains' sums")
        if len(counts) != parts or any(int(r) < 1 for r in counts):
            raise ValueError(f"named_rows[{t}]: {parts} positive row counts expected (one per part), "
                             f"got {list(counts)[:8]}")
    reasons: list[str | None] = [why_not_split(g, c, parts) for c in chains]
    if boundaries is not None:
        reasons = [r if r is not None or c.edges == boundaries[-1] else
                   f"{describe_node(g, c.sink)} sums {c.edges} edges; the boundaries end at {boundaries[-1]}"
                   for c, r in zip(chains, reasons, strict=True)]
    todo = [c for c, r in zip(chains, reasons, strict=True) if r is None]
    if not todo:
        return None, reasons
    edit = GraphEditor(g)
    replaced: dict[int, list[int]] = {}
    late: dict[int, int] = {}     # a sum's zeros -> part 0's sum, which they now run right before
    gone: set[int] = set()
    changed: list[int] = []
    for c in todo:
        try:
            index = g.nodes[c.sink].args[2]
            rows = (named_rows or {}).get(index.id) if isinstance(index, TensorRef) else None
            added, total = _split_one(edit, g, c, parts, edge_ranges(c.edges, parts, boundaries), rows)
        except (InferenceError, GraphError) as e:
            raise RuleError(f"{describe_node(g, c.sink)}: {e}") from e
        for u, t in _template_readers(g, c):
            source = _template_source(g, c, t)
            if source is None:
                raise RuleError(f"{describe_node(g, u)}: no tensor of the chain's dtype to take it from")
            edit.rewire(u, {t: source})
            changed.append(u)
        for t in g.nodes[c.sink].output_ids():
            for u in g.users(t):
                if u not in c.nodes:
                    edit.rewire(u, {t: total})
                    changed.append(u)
        for k, preds in g.control.items():
            if c.sink in preds:
                edit.set_control(k, tuple(added[-1] if p == c.sink else p for p in preds))
                changed.append(k)
        replaced[c.sink] = added
        first_sum = next(x for x in added if edit.graph.nodes[x].op in SINKS)
        late.update({u: first_sum for u, _ in _template_readers(g, c) if _only_for(g, u, c.sink)})
        gone.update(c.nodes)
    edit.remove_nodes(sorted(gone))

    def respliced(seq: Sequence[int]) -> list[int]:
        out: list[int] = []
        for v in seq:
            if v in late or (v in gone and v not in replaced):
                continue
            for x in replaced.get(v, (v,)):
                out.extend(u for u, at in late.items() if at == x)
                out.append(x)
        return out

    edit.set_order(respliced(g.order))
    return Rewrite(
        graph=edit.finish(), order=respliced(order), added=tuple(x for v in replaced.values() for x in v),
        changed=tuple(dict.fromkeys(changed)), removed=tuple(sorted(gone)),
        description=f"{len(todo)} sum(s) over edges run in {parts} "
                    f"{'edge ranges' if boundaries is None else 'given edge ranges'}",
    ), reasons
