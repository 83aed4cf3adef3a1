"""The plain graph a fissioned step runs: every enabled F-Tree node unrolled into its n parts.

`expand(g, order, tree, dgraph)` returns an ordinary IR graph (Expanded.graph) and a
topological order of it (Expanded.order) that do exactly what the generated fission loops do,
so that memory (peakcut.memory.simulate) and latency (peakcut.simulate.simulate_timeline) of a
fissioned step are those of an ordinary graph, with part shapes, slices, copies and
accumulations all visible. For a region S split along the D-Graph label L into n parts
(MAGIS §4.2: inputs sliced or shared, outputs concatenated or reduced):

- S is made contiguous in the order: the outside nodes interleaved with S that S depends on
  go before it, the others after (convexity makes that possible);
- a tensor leaving S (read outside S or returned) that is a view of a tensor of S (detach,
  view, t, ... of an activation saved for the backward) is not merged itself: its view node
  stays whole and runs after the parts on the merged base, which leaves S in its place (the
  parts copy such a view only if a part node reads it; a region of views only splits
  nothing and expands to no part nodes);
- before the parts, every boundary output t of S (read outside S or returned) is
  preallocated by a node that outputs t itself (same tensor id and storage, so the readers
  outside S are untouched): aten.empty_strided for concatenated ("cat") and "same" outputs,
  zeros for the reduced ones ("sum", "mean", "nll_mean");
- part k = 0..n-1: every input a node reads along L is an aten.slice.Tensor view of the
  whole tensor (no new memory), every node of S is copied with its tensor arguments rewired
  to part tensors and its arguments as peakcut.ir.dims.split_node_args gives them (size
  arguments divided; nll_loss with reduction=sum); output metadata comes from running the op
  on FakeTensors of the part inputs, so a part output that aliases a part input (a view, an
  in-place result) shares that input's storage and the others get fresh storages;
- right after a boundary output's last writer in the part, the part result is written into
  the preallocated tensor: copy_ into an aten.slice.Tensor view ("cat"), copy_ of the whole
  tensor ("same": every part computes the same value, so every part writes it and the loop
  body stays the same for all parts), add_ ("sum", "mean", "nll_mean"); after the last part,
  "mean" divides by n and "nll_mean" (a mean nll_loss split into per-part sums) divides the
  summed loss by the summed total weight;
- the writes of one output are chained by control edges (part k after part k-1), every reader
  outside S gets a control edge to the last write, and every control edge of the original
  nodes is kept, mapped to the copies (inside S: the copy in the same part);
- every node made carries a FissionTag (peakcut.ir.tags): part copies role "part" with the
  F-Tree node, part k, the original node, the path ((F-Tree node, part), ...) outermost
  first, n, L (the node's own label of the D-Graph dimension) and the D-Graph component;
  preallocations, slices and merges roles "alloc", "slice", "contiguous", "merge" (slices
  and per-part merges also with part, path and n), from which codegen.fission rebuilds the
  loops.

Nested enabled F-Tree nodes are expanded inside each part of their parent (outermost first),
using the original nodes' dimension rules for the copies (a copy's shapes are the original's
divided along the parent's label; rules re-derived from them could lose labels of length 1).

Anything that cannot be proven exact is refused with a FissionError naming the node or tensor:
a part tensor read along other dimensions than it was produced, a partial (reduced) result
read inside the region, a merge kind other than cat/same/sum/mean/nll_mean (amax, amin, prod,
any, all, logsumexp), an in-place result leaving the region, a boundary output at an offset
in its storage or sharing it with another, a part shape that is not the original's divided
along L, a label that does not divide, a non-convex region, enabled regions that overlap
without nesting.

Compact expansion (compact=True, what the optimizer evaluates its fission states on): every
region builds part 0 only (nested regions inside it likewise), then an aten.alias node per
region input that the caller does not hold (role "keep", after the part's
last touch of that input). Parts are identical and contiguous, and the full expansion's part
k < n - 1 holds every region input live, so the memory curve over part 0 here equals the
full one's over any part k < n - 1, and part n - 1 never exceeds it: the simulated peak of
the compact graph is the full one's (n >= 2). Latency is the full one's when a node of
path ((f1, _), (f2, _), ...) is priced n(f1) * n(f2) * ... times and a "keep" node nothing
(peakcut.optimizer.compact.RepeatedCost). The compact graph is for evaluation only: it does
not compute the step.

Speed (an optimizer calls expand per candidate): the FakeTensor run of a node is memoized per
expansion by op, arguments and input layouts (parts and repeated layers make the same calls),
and the final Graph.check runs its shape check once per distinct call; check=False skips it.

    ex = expand(g, order, tree, dgraph)
    peakcut.memory.simulate(ex.graph, ex.order).peak_bytes       # memory of the fissioned step
    simulate_timeline(ex.graph, ex.order, cost).latency_seconds  # its latency
    Step(ex.graph, ex.order)                                    # its program, with loops
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from peakcut.fission.dgraph import DGraph
from peakcut.fission.ftree import FNode, FTree
from peakcut.fission.reuse import ExpansionCache, Snapshot, Step
from peakcut.ir.check import _check_node_shapes, check_graph
from peakcut.ir.dims import CAT, SAME, DimRule, PartCall, split_node_args
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.infer import InferenceError, Layout, LayoutMemo, Unhashable, encode
from peakcut.ir.node import Node, Phase, TensorRef, map_refs
from peakcut.ir.node_cache import NodeCache
from peakcut.ir.registry import OpKind, lookup
from peakcut.ir.tags import FissionTag, NodeTags, Path
from peakcut.ir.tensor import TensorMeta
from peakcut.transform.rewrite import describe_node, describe_tensor

SUPPORTED_MERGES = (CAT, SAME, "sum", "mean", "nll_mean")
"""How boundary outputs can be rebuilt from the parts (DimRule.combine kinds)."""


class FissionError(ValueError):
    """A fission cannot be expanded exactly; the message names the node or tensor and why."""


@dataclass(frozen=True)
class ExpandedRegion:
    """One expanded region instance (a nested region has one per enclosing part)."""

    fnode: int                          # F-Tree node id
    path: Path                          # enclosing (F-Tree node, part) pairs
    label: str                          # the label of D at the region's first node
    n: int
    allocs: tuple[int, ...]             # preallocation nodes, before the parts
    parts: tuple[tuple[int, ...], ...]  # per part: its nodes in order (slices, copies, writes)
    merges: tuple[int, ...]             # merge nodes after the last part (mean, nll_mean)
    replayed: tuple[int, ...] = ()      # view nodes of S kept whole, run on the merged bases


@dataclass(frozen=True)
class Expanded:
    """A fissioned step as a plain graph and a topological order of it."""

    graph: Graph
    order: list[int]
    copies: Mapping[int, tuple[int, ...]]  # original node id -> its part copies, in order
    regions: tuple[ExpandedRegion, ...] = field(default=())


@dataclass(frozen=True)
class _Out:
    """A boundary output of a region and how the parts rebuild it."""

    tensor: int
    producer: int
    index: int          # position in the producer's outputs
    kind: str           # CAT, SAME, "sum", "mean", "nll_mean"
    dim: int | None     # the L dimension of a CAT output
    writer: int         # the last node of the region writing the tensor's storage


def expand(g: Graph, order: Sequence[int], tree: FTree, dgraph: DGraph, *,
           check: bool = True, compact: bool = False,
           memo: LayoutMemo | None = None,
           reuse: ExpansionCache | None = None) -> Expanded:
    """The unrolled graph of every enabled F-Tree node (see module doc); g is not modified.

    check: validate the expanded graph as Graph.check does (raising GraphError); a caller that
    trusts g and the expansion may skip it.
    compact: build part 0 of every region only, for evaluation (see "Compact expansion" in
    the module doc); the result is not a program.
    memo: the FakeTensor-run memo to use (share one across expansions of graphs of the same
    device; its entries are pure functions of their keys).
    reuse: snapshots to start from and add to (peakcut.fission.reuse); the result is the same
    as without.
    """
    order = list(order)
    if len(order) != len(g.nodes) or set(order) != set(g.nodes):
        raise FissionError(f"the order has {len(order)} nodes, the graph {len(g.nodes)} "
                           "(not a permutation of the graph's nodes)")
    enabled = tree.enabled()
    children, roots = _nesting(g, enabled, dgraph)
    by_id = {f.id: f for f in enabled}
    start = None
    if reuse is not None:
        start = reuse.longest(g, order, dgraph, compact, _planned_steps(by_id, children, roots, compact))
    expander = _Expander(g, order, dgraph.rules, compact, memo) if start is None else \
        _Expander.resumed(start, compact, memo)
    taken: list[Step] = [] if start is None else list(start.steps)
    taken_parts: list[tuple[dict[int, int], ...]] = [] if start is None else list(start.parts)
    position = 0

    def split(f: FNode, current: Mapping[int, int], path: Path) -> None:
        nonlocal position
        here = [v for v in f.nodes if v in current]
        if not here:
            return
        step = _step(f, path)
        if position < len(taken):      # taken by the snapshot this expansion started from
            if taken[position] != step:
                raise RuntimeError(f"expansion snapshot out of step at F-Tree node {f.id}: "
                                   "a region expanded differently from the same graph")
            parts: Sequence[Mapping[int, int]] = taken_parts[position]
        else:
            parts = expander.region(frozenset(current[v] for v in here),
                                    {current[v]: f.labels[v] for v in here}, f.n, f.id, path,
                                    f.component)
            if reuse is not None:
                taken.append(step)
                taken_parts.append(tuple(parts))
                reuse.save(g, order, dgraph, compact, expander.snapshot(tuple(taken), tuple(taken_parts)),
                           tuple(enabled))
        position += 1
        for k, part in enumerate(parts):
            # views the parts do not need were not copied (they run whole after the parts)
            inner = {v: part[current[v]] for v in here if current[v] in part}
            for child in children[f.id]:
                split(by_id[child], inner, (*path, (f.id, k)))

    for root in roots:
        split(by_id[root], {v: v for v in by_id[root].nodes}, ())
    return expander.result(check)


def _step(f: FNode, path: Path) -> Step:
    """What decides the expansion of region f inside `path` (peakcut.fission.reuse)."""
    return (f.id, f.n, path, f.nodes, id(f.labels), f.component)


def expansion_steps(g: Graph, tree: FTree, dgraph: DGraph, *, compact: bool) -> list[Step]:
    """The regions expand(g, ..., tree, dgraph, compact=compact) expands, in its order, as the
    steps peakcut.fission.reuse keys snapshots by."""
    enabled = tree.enabled()
    children, roots = _nesting(g, enabled, dgraph)
    return _planned_steps({f.id: f for f in enabled}, children, roots, compact)


def _planned_steps(by_id: Mapping[int, FNode], children: Mapping[int, list[int]], roots: list[int],
                   compact: bool) -> list[Step]:
    """The regions expand() expands, in its order (a region whose nodes no part copied is
    skipped there, which only makes the snapshot lookup miss)."""
    steps: list[Step] = []

    def walk(f: FNode, path: Path) -> None:
        steps.append(_step(f, path))
        for k in range(1 if compact else f.n):
            for child in children[f.id]:
                walk(by_id[child], (*path, (f.id, k)))

    for root in roots:
        walk(by_id[root], ())
    return steps


def _nesting(g: Graph, enabled: Sequence[FNode],
             dgraph: DGraph) -> tuple[dict[int, list[int]], list[int]]:
    """Direct children of each enabled F-Tree node among the enabled ones, and the roots.

    Enabled regions must be nested or disjoint; a child's parent is the smallest enabled
    region strictly containing it.
    """
    for f in enabled:
        unknown = [v for v in f.nodes if v not in g.nodes]
        if unknown:
            raise FissionError(f"F-Tree node {f.id} holds node {unknown[0]}, which the graph lacks")
        if set(f.labels) != set(f.nodes):
            raise FissionError(f"F-Tree node {f.id}: its labels do not cover exactly its nodes")
        ruleless = [v for v in f.nodes if v not in dgraph.rules]
        if ruleless:
            raise FissionError(f"F-Tree node {f.id}: {describe_node(g, ruleless[0])} has no dimension rule")
    children: dict[int, list[int]] = {f.id: [] for f in enabled}
    roots: list[int] = []
    for f in sorted(enabled, key=lambda x: (len(x.nodes), x.id)):
        holders = []
        for h in enabled:
            if h.id == f.id or not (h.nodes & f.nodes):
                continue
            if f.nodes < h.nodes:
                holders.append(h)
            elif not h.nodes < f.nodes:
                raise FissionError(f"enabled F-Tree nodes {f.id} and {h.id} overlap without "
                                   "nesting (or cover the same nodes)")
        if holders:
            children[min(holders, key=lambda h: len(h.nodes)).id].append(f.id)
        else:
            roots.append(f.id)
    return children, roots


class _Expander:
    """Expands regions one after the other on a private copy of the graph (a GraphEditor's)."""

    def __init__(self, g: Graph, order: list[int], rules: Mapping[int, DimRule], compact: bool = False,
                 memo: LayoutMemo | None = None, *, next_id: int | None = None,
                 regions: Sequence[ExpandedRegion] = ()) -> None:
        self.edit = GraphEditor(g, next_id=next_id, memo={} if memo is None else memo)
        self.g = self.edit.graph
        self.compact = compact
        self.order = list(order)
        self.rules: dict[int, DimRule] = dict(rules)
        self.regions: list[ExpandedRegion] = list(regions)

    @classmethod
    def resumed(cls, snap: Snapshot, compact: bool, memo: LayoutMemo | None) -> _Expander:
        """An expander going on from a snapshot (its graph copied: snapshots stay as they are)."""
        return cls(snap.graph, list(snap.order), snap.rules, compact, memo, next_id=snap.next_id,
                   regions=snap.regions)

    def snapshot(self, steps: tuple[Step, ...], parts: tuple[tuple[dict[int, int], ...], ...]) -> Snapshot:
        """This expander's state after `steps` (copies: the expander goes on)."""
        return Snapshot(self.g.copy(), tuple(self.order), dict(self.rules), tuple(self.regions),
                        self.edit.next_id, steps, parts)

    # ------------------------------------------------------------ nodes
    def _add(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], *, name: str,
             phase: Phase, module: str, tag: FissionTag, what: str,
             multi_output: bool = False, names: Sequence[str] | None = None,
             inherit: NodeTags | None = None,
             outputs: Sequence[int] | None = None,
             expect: Sequence[tuple[tuple[int, ...], str] | None] | None = None) -> Node:
        """Add a node running `op`; its output metas come from running it on FakeTensors
        (GraphEditor.add_op: views and in-place results live in their input's storage).

        names: output tensor names (default: the node's). outputs: existing tensor ids the
        node outputs instead (a preallocation outputs the tensor it stands for; the layout must
        match). expect: per output, the (shape, dtype) it must have (None: anything). what: the
        node, as error messages name it. tag: its fission tag; inherit: the tags it takes the
        others from (a part copy keeps its original's).
        """
        g = self.g

        def check(layouts: list[Layout | None]) -> None:
            for j, layout in enumerate(layouts):
                want = None if expect is None else expect[j]
                if layout is None:
                    if want is not None:
                        raise FissionError(f"{what}: output {j} is missing in the part")
                    continue
                shape, stride, dtype, _, source = layout
                if want is not None and (shape, dtype) != want:
                    raise FissionError(f"{what}: part output {j} is {shape} {dtype}, but the original "
                                       f"output split along the label is {want[0]} {want[1]}")
                if outputs is not None:
                    meta = g.tensors[outputs[j]]
                    if source[0] != "fresh" or (shape, stride, dtype) != (meta.shape, meta.stride,
                                                                          meta.dtype):
                        raise FissionError(f"{what} cannot reproduce the layout of "
                                           f"{describe_tensor(g, outputs[j])}")

        tags = NodeTags(fission=tag) if inherit is None else replace(inherit, fission=tag)
        try:
            return self.edit.add_op(op, args, kwargs, name=name, phase=phase, module=module,
                                    tags=tags, multi_output=multi_output, names=names,
                                    outputs=outputs, check=check)
        except InferenceError as e:
            raise FissionError(f"{what} fails on its part inputs: {e.cause}") from None

    def _control(self, node: int, after: Iterable[int]) -> None:
        deps = set(self.g.control.get(node, ())) | set(after)
        deps.discard(node)
        if deps:
            self.edit.set_control(node, tuple(sorted(deps)))

    # ------------------------------------------------------------ one region
    def region(self, nodes: frozenset[int], labels: Mapping[int, str], n: int, fid: int,
               path: Path, component: int = -1) -> list[dict[int, int]]:
        """Expand region `nodes` of the current graph into n parts; per part, node -> copy."""
        g = self.g
        if n < 2:
            raise FissionError(f"F-Tree node {fid}: n = {n} is not a fission")
        pos = {nid: i for i, nid in enumerate(self.order)}
        members = sorted(nodes, key=pos.__getitem__)
        first, last = pos[members[0]], pos[members[-1]]
        before, after = self._interleaved(nodes, self.order[first:last + 1], fid)
        produced = {t: v for v in members for t in g.nodes[v].output_ids()}
        outs, replayed = self._boundary(nodes, members, labels, produced)
        removed = nodes - replayed          # replayed views stay, as outside nodes after S
        control = {v: g.control.get(v, ()) for v in members}
        copied = self._copied(members, replayed, control)
        readers = {o.tensor: [u for u in g.users(o.tensor) if u not in removed] for o in outs}

        allocs, totals = self._allocate(outs, fid, path)
        parts: list[dict[int, int]] = []
        blocks: list[list[int]] = []
        last_write: dict[int, int] = {}    # preallocated tensor -> its latest write node
        for k in range(1 if self.compact else n):
            copy_of: dict[int, int] = {}
            part_of: dict[int, int] = {}   # tensor of S -> its part tensor
            slices: dict[tuple[int, int], int] = {}
            block: list[int] = []
            here = (*path, (fid, k))
            for v in copied:
                copy = self._copy(v, labels, n, k, (fid, component), here, produced, part_of,
                                  slices, block)
                copy_of[v] = copy.id
                for t, c in zip(g.nodes[v].outputs, copy.outputs, strict=True):
                    if t is not None:
                        part_of[t] = c
                for o in outs:
                    if o.writer == v:
                        self._write(o, part_of, totals, k, n, fid, here, block, last_write)
            parts.append(copy_of)
            blocks.append(block)
        if self.compact:
            blocks[0].extend(self._keep_alive(copied, produced, blocks[0], fid, path))
        merges = self._finish(outs, totals, n, fid, path, last_write)

        # control edges: the originals' (mapped to the copies), readers after the last write
        for copy_of in parts:
            for v in copied:
                self._control(copy_of[v], [copy_of.get(b, b) for b in control[v]])
        for u, deps in list(g.control.items()):
            if u not in removed and any(d in removed for d in deps):
                mapped = {d for d in deps if d not in removed}
                mapped |= {copy_of[d] for copy_of in parts for d in deps if d in removed}
                self.edit.set_control(u, tuple(sorted(mapped)))
        for o in outs:
            for u in readers[o.tensor]:
                self._control(u, [last_write[o.tensor]])

        for copy_of in parts:
            for v, c in copy_of.items():
                self.rules[c] = self.rules[v]
        self._remove([v for v in members if v in removed], {o.tensor for o in outs})
        block_order = allocs + [nid for b in blocks for nid in b] + merges
        after = [v for v in members if v in replayed] + after
        self.order = self.order[:first] + before + block_order + after + self.order[last + 1:]
        self.edit.set_order(self.order)   # Graph.users follows the graph's own order
        self.regions.append(ExpandedRegion(fid, path, labels[members[0]], n, tuple(allocs),
                                           tuple(tuple(b) for b in blocks), tuple(merges),
                                           tuple(v for v in members if v in replayed)))
        return parts

    def _keep_alive(self, copied: list[int], produced: Mapping[int, int], block: list[int], fid: int,
                    path: Path) -> list[int]:
        """Compact expansion: after part 0, an alias of every region input the step does not
        hold anyway, ordered after the part's last touch of the input's storage. In the full
        expansion such an input is touched again by the later parts, so it stays live through
        part 0 as it does here; the aliases cost nothing (role "keep")."""
        g = self.g
        if not block:
            return []
        skip = g.caller_held_storages() | g.host_storages()
        inputs = sorted({t for v in copied for t in g.nodes[v].input_ids() if t not in produced
                         and g.tensors[t].storage not in skip})
        touching: dict[int, list[int]] = {}     # storage -> block nodes reading it
        for b in block:
            for t in g.nodes[b].input_ids():
                touching.setdefault(g.tensors[t].storage, []).append(b)
        keep: list[int] = []
        for t in inputs:
            node = self._add("aten.alias.default", (TensorRef(t),), {},
                             name=f"{g.tensors[t].name or t}_keep", phase=g.nodes[block[-1]].phase,
                             module=g.nodes[block[-1]].module,
                             tag=FissionTag(fid, "keep", path),
                             what=f"keep-alive of {describe_tensor(g, t)}")
            self._control(node.id, touching.get(g.tensors[t].storage, ()))
            keep.append(node.id)
        return keep

    def _copied(self, members: list[int], replayed: frozenset[int],
                control: Mapping[int, tuple[int, ...]]) -> list[int]:
        """The members each part runs: all but the replayed views no part node needs (read,
        directly or through other views, or waited for by a control edge)."""
        g = self.g
        needed: set[int] = set()
        awaited: set[int] = set()
        for v in reversed(members):    # readers and waiters come later in the order
            if v in replayed and v not in awaited and not any(
                    u in needed for t in g.nodes[v].output_ids() for u in g.users(t)):
                continue
            needed.add(v)
            awaited.update(control[v])
        return [v for v in members if v in needed]

    def _interleaved(self, nodes: frozenset[int], segment: list[int],
                     fid: int) -> tuple[list[int], list[int]]:
        """Outside nodes between the region's first and last node: (S depends on them, others)."""
        g = self.g
        inside = set(segment)
        succ: dict[int, list[int]] = {}
        for w in segment:
            for p in g.predecessors(w):
                if p in inside:
                    succ.setdefault(p, []).append(w)
        needed: set[int] = set()
        for u in reversed(segment):
            if u not in nodes and any(w in nodes or w in needed for w in succ.get(u, ())):
                needed.add(u)
        downstream: set[int] = set()
        for u in segment:
            if u not in nodes and any(p in nodes or p in downstream
                                      for p in g.predecessors(u) if p in inside):
                downstream.add(u)
        both = needed & downstream
        if both:
            raise FissionError(f"F-Tree node {fid} is not convex: {describe_node(g, min(both))} depends "
                               "on the region and the region depends on it")
        return ([u for u in segment if u in needed],
                [u for u in segment if u not in nodes and u not in needed])

    def _boundary(self, nodes: frozenset[int], members: list[int], labels: Mapping[int, str],
                  produced: Mapping[int, int]) -> tuple[list[_Out], frozenset[int]]:
        """The tensors to preallocate and merge, and the view nodes replayed after the parts.

        A tensor leaving S (read outside or returned) that is a view of a tensor of S is not
        merged itself: its view op is replayed on the merged base after the last part (the
        original node, unchanged), and the base is merged instead. In-place results leaving S
        are refused (replaying would apply the write twice), and so is every merge that is not
        exact.
        """
        g = self.g
        program = set(g.outputs)
        leaving = [t for v in members for t in g.nodes[v].output_ids()
                   if t in program or any(u not in nodes for u in g.users(t))]
        replayed: set[int] = set()
        merged: set[int] = set()
        while leaving:
            t = leaving.pop()
            v = produced[t]
            storage = g.tensors[t].storage
            aliased = [x for x in g.nodes[v].input_ids() if g.tensors[x].storage == storage]
            if not aliased:
                merged.add(t)
                continue
            if not _pure_view(g, v):
                raise FissionError(f"{describe_tensor(g, t)} of {describe_node(g, v)} leaves the region but is an "
                                   "in-place result (replaying it after the parts would write "
                                   "twice)")
            replayed.add(v)
            leaving.extend(x for x in aliased if x in produced and x not in merged)
        position = {v: i for i, v in enumerate(members)}
        writes: dict[int, list[int]] = {}   # storage -> members writing it in place
        for w in members:
            for x in g.mutated_tensors(w):
                writes.setdefault(g.tensors[x].storage, []).append(w)
        outs: list[_Out] = []
        seen_storages: dict[int, int] = {}
        for v in members:
            node = g.nodes[v]
            rule, label = self.rules[v], labels[v]
            if label not in rule.labels():
                raise FissionError(f"{describe_node(g, v)} does not carry label {label!r} in its rule")
            combine = rule.combine(label)
            for j, t in enumerate(node.outputs):
                if t not in merged:
                    continue
                meta = g.tensors[t]
                kind = combine[j]
                if kind == "nll_mean":
                    if len(node.outputs) != 2 or j not in (0, 1):
                        raise FissionError(f"{describe_node(g, v)}: merge 'nll_mean' expects the outputs "
                                           "(loss, total_weight)")
                    kind = "nll_mean" if j == 0 else "sum"   # total weights add up
                if kind not in SUPPORTED_MERGES:
                    raise FissionError(f"{describe_tensor(g, t)} of {describe_node(g, v)} leaves the region with "
                                       f"merge kind {kind!r}, which the expansion does not support")
                if meta.storage_offset != 0:
                    raise FissionError(f"{describe_tensor(g, t)} of {describe_node(g, v)} leaves the region at "
                                       "an offset in its storage: it cannot be preallocated")
                if meta.storage in seen_storages:
                    other = describe_tensor(g, seen_storages[meta.storage])
                    raise FissionError(f"{describe_tensor(g, t)} and {other} leave the region in one "
                                       "storage")
                seen_storages[meta.storage] = t
                writer = max([v, *writes.get(meta.storage, [])], key=position.__getitem__)
                dim = rule.outputs[j].index(label) if kind == CAT else None
                outs.append(_Out(t, v, j, kind, dim, writer))
        return outs, frozenset(replayed)

    # ------------------------------------------------------------ allocation and merging
    def _allocate(self, outs: list[_Out], fid: int, path: Path) -> tuple[list[int], dict[int, int]]:
        """Preallocation nodes, in order, and per nll_mean producer the tensor its parts' total
        weights add into (its own total_weight output if that leaves the region, else a
        scratch zero tensor allocated here and freed after the final division)."""
        g = self.g
        allocs: list[int] = []
        totals: dict[int, int] = {}
        leaving = {o.tensor for o in outs}
        for o in outs:
            producer = g.nodes[o.producer]
            meta = g.tensors[o.tensor]
            tag = FissionTag(fid, "alloc", path)
            where = {"phase": producer.phase, "module": producer.module}
            if o.kind in (CAT, SAME):
                node = self._add(
                    "aten.empty_strided.default", (list(meta.shape), list(meta.stride)),
                    {"dtype": meta.torch_dtype, "device": torch.device(g.device)},
                    name=f"{meta.name or o.tensor}_alloc", tag=tag, outputs=[o.tensor],
                    what=f"preallocation of {describe_tensor(g, o.tensor)}", **where)
                allocs.append(node.id)
            else:
                allocs.extend(self._zeros(meta, tag, where, existing=o.tensor))
            if o.kind == "nll_mean":
                total = producer.outputs[1]
                if total in leaving:
                    totals[o.producer] = total
                else:
                    scratch = self._zeros(g.tensors[total], tag, where, existing=None)
                    allocs.extend(scratch)
                    totals[o.producer] = g.nodes[scratch[-1]].outputs[0]
        return allocs, totals

    def _zeros(self, meta: TensorMeta, tag: FissionTag, where: dict[str, Any],
               existing: int | None) -> list[int]:
        """Nodes making a zero tensor with meta's layout (outputting `existing` if given)."""
        g = self.g
        opts = {"dtype": meta.torch_dtype, "device": torch.device(g.device)}
        name = f"{meta.name or meta.id}_{'alloc' if existing is not None else 'total'}"
        outputs = [existing] if existing is not None else None
        what = f"zero preallocation of {describe_tensor(g, meta.id)}"
        if existing is None or meta.stride == _contiguous_strides(meta.shape):
            node = self._add("aten.zeros.default", (list(meta.shape),), opts, name=name,
                             tag=tag, outputs=outputs, what=what, **where)
            return [node.id]
        empty = self._add("aten.empty_strided.default", (list(meta.shape), list(meta.stride)), opts,
                          name=name, tag=tag, outputs=outputs, what=what, **where)
        zero = self._add("aten.zero_.default", (TensorRef(existing),), {}, name=f"{name}_zero",
                         tag=tag, what=what, **where)
        return [empty.id, zero.id]

    def _write(self, o: _Out, part_of: Mapping[int, int], totals: Mapping[int, int], k: int,
               n: int, fid: int, here: Path, block: list[int], last_write: dict[int, int]) -> None:
        """Write part k's value of boundary output `o` into its preallocated tensor."""
        g = self.g
        producer = g.nodes[o.producer]
        meta = g.tensors[o.tensor]
        part = part_of[o.tensor]
        tag = FissionTag(fid, "merge", here, k, n)
        where = {"phase": producer.phase, "module": producer.module}
        base = meta.name or str(o.tensor)
        what = f"writing part {k} of {describe_tensor(g, o.tensor)}"
        writes: list[tuple[int, tuple[Any, ...], str]] = []   # (written tensor, args, op)
        if o.kind == CAT:
            step = meta.shape[o.dim] // n
            view = self._add(
                "aten.slice.Tensor", (TensorRef(o.tensor), o.dim, k * step, (k + 1) * step), {},
                name=f"{base}_slice", what=what, **where, tag=FissionTag(fid, "slice", here, k, n))
            block.append(view.id)
            writes.append((o.tensor, (TensorRef(view.outputs[0]), TensorRef(part)),
                           "aten.copy_.default"))
        elif o.kind == SAME:
            writes.append((o.tensor, (TensorRef(o.tensor), TensorRef(part)), "aten.copy_.default"))
        else:
            writes.append((o.tensor, (TensorRef(o.tensor), TensorRef(part)), "aten.add_.Tensor"))
        if o.kind == "nll_mean" and totals[o.producer] != producer.outputs[1]:
            scratch = totals[o.producer]
            writes.append((scratch, (TensorRef(scratch), TensorRef(part_of[producer.outputs[1]])),
                           "aten.add_.Tensor"))
        for target, args, op in writes:
            node = self._add(op, args, {}, name=f"{g.tensors[target].name or target}_write",
                             tag=tag, what=what, **where)
            self._control(node.id, [last_write[target]] if target in last_write else [])
            last_write[target] = node.id
            block.append(node.id)

    def _finish(self, outs: list[_Out], totals: Mapping[int, int], n: int, fid: int, path: Path,
                last_write: dict[int, int]) -> list[int]:
        """Merge nodes after the last part: mean divides by n, nll_mean by the total weight."""
        g = self.g
        merges: list[int] = []
        for o in outs:
            if o.kind not in ("mean", "nll_mean"):
                continue
            producer = g.nodes[o.producer]
            where = {"phase": producer.phase, "module": producer.module}
            tag = FissionTag(fid, "merge", path, n=n)
            name = f"{g.tensors[o.tensor].name or o.tensor}_merge"
            what = f"the merge of {describe_tensor(g, o.tensor)}"
            if o.kind == "mean":
                node = self._add("aten.div_.Scalar", (TensorRef(o.tensor), n), {}, name=name,
                                 tag=tag, what=what, **where)
                deps = [last_write[o.tensor]]
            else:
                total = totals[o.producer]
                node = self._add("aten.div_.Tensor", (TensorRef(o.tensor), TensorRef(total)), {},
                                 name=name, tag=tag, what=what, **where)
                deps = [last_write[o.tensor], last_write[total]]
            self._control(node.id, deps)
            last_write[o.tensor] = node.id
            merges.append(node.id)
        return merges

    # ------------------------------------------------------------ copying one node
    def _copy(self, v: int, labels: Mapping[int, str], n: int, k: int, region: tuple[int, int],
              here: Path, produced: Mapping[int, int], part_of: Mapping[int, int],
              slices: dict[tuple[int, int], int], block: list[int]) -> Node:
        """Part k of node v: slices of what it reads along the label, then the copy."""
        g = self.g
        node = g.nodes[v]
        rule, label = self.rules[v], labels[v]
        fid, component = region
        try:
            call = _part_call(g, v, rule, label, n, k)
        except ValueError as e:
            raise FissionError(f"{describe_node(g, v)} cannot be split along {label!r} into {n}: "
                               f"{e}") from None
        mapping: dict[int, int] = {}
        for t, dims in zip(node.input_ids(), rule.inputs, strict=True):
            if t in produced:
                wanted = dims.index(label) if label in dims else None
                mapping[t] = self._part_input(t, produced[t], labels[produced[t]], wanted, v,
                                              part_of)
            elif t in call.narrows:
                dim, start, length = call.narrows[t]
                if (t, dim) not in slices:
                    view = self._add(
                        "aten.slice.Tensor", (TensorRef(t), dim, start, start + length), {},
                        name=f"{g.tensors[t].name or t}_slice", phase=node.phase,
                        module=node.module,
                        tag=FissionTag(fid, "slice", here, k, n),
                        what=f"slice {k} of {describe_tensor(g, t)} for {describe_node(g, v)}")
                    slices[(t, dim)] = view.outputs[0]
                    block.append(view.id)
                mapping[t] = slices[(t, dim)]
                if t in call.contiguous:  # a kernel that misreads strided inputs (PartCall doc)
                    if (t, -1 - dim) not in slices:
                        dense = self._add(
                            "aten.clone.default", (TensorRef(slices[(t, dim)]),),
                            {"memory_format": torch.contiguous_format},
                            name=f"{g.tensors[t].name or t}_dense", phase=node.phase,
                            module=node.module,
                            tag=FissionTag(fid, "contiguous", here, k, n),
                            what=f"contiguous slice {k} of {describe_tensor(g, t)} for {describe_node(g, v)}")
                        slices[(t, -1 - dim)] = dense.outputs[0]
                        block.append(dense.id)
                    mapping[t] = slices[(t, -1 - dim)]
        expect: list[tuple[tuple[int, ...], str] | None] = []
        names: list[str] = []
        suffix = f"_p{k}"
        for t, dims in zip(node.outputs, rule.outputs, strict=True):
            if t is None:
                expect.append(None)
                names.append("")
                continue
            meta = g.tensors[t]
            shape = tuple(s // n if d == label else s
                          for s, d in zip(meta.shape, dims, strict=True))
            expect.append((shape, meta.dtype))
            names.append(f"{meta.name or t}{suffix}")

        def rewired(ref: TensorRef) -> TensorRef:
            return TensorRef(mapping.get(ref.id, ref.id))

        origin = node.tags.fission.of if node.tags.fission is not None else None
        args, kwargs = map_refs(call.args, rewired), map_refs(dict(call.kwargs), rewired)
        copy = self._add(call.op, args, kwargs,
                         name=f"{node.name or v}{suffix}", phase=node.phase, module=node.module,
                         multi_output=node.multi_output, names=names, expect=expect,
                         tag=FissionTag(fid, "part", here, k, n, v if origin is None else origin, label,
                                        component),
                         inherit=node.tags,
                         what=f"part {k} of {describe_node(g, v)}")
        block.append(copy.id)
        return copy

    def _part_input(self, t: int, producer: int, label: str, wanted: int | None, reader: int,
                    part_of: Mapping[int, int]) -> int:
        """The part tensor of an inner tensor, if the reader reads it as its producer splits it."""
        g = self.g
        rule = self.rules[producer]
        j = g.nodes[producer].outputs.index(t)
        kind = rule.combine(label)[j]
        made = rule.outputs[j].index(label) if kind == CAT else None
        if kind not in (CAT, SAME):
            raise FissionError(f"{describe_node(g, reader)} reads {describe_tensor(g, t)} inside the region, but "
                               f"each part only has a partial result of it (merge {kind!r})")
        if made != wanted:
            raise FissionError(f"{describe_node(g, reader)} reads {describe_tensor(g, t)} split along dimension "
                               f"{wanted}, but its producer splits it along {made}")
        return part_of[t]

    # ------------------------------------------------------------ cleanup and result
    def _remove(self, members: list[int], kept: set[int]) -> None:
        """Drop the original nodes of a region and what only they used."""
        self.edit.remove_nodes(members, keep_tensors=kept)
        for v in members:
            self.rules.pop(v, None)
        self.edit.remove_unused_storages()

    def result(self, check: bool = True) -> Expanded:
        self.edit.set_order(self.order)
        g = self.edit.finish()
        if check:
            _check(g)
        copies: dict[int, list[int]] = {}
        for nid in self.order:
            tag = g.nodes[nid].tags.fission
            if tag is not None and tag.of is not None:
                copies.setdefault(tag.of, []).append(nid)
        return Expanded(g, list(self.order), {k: tuple(v) for k, v in copies.items()},
                        tuple(self.regions))


_PART_CALLS: NodeCache[PartCall] = NodeCache()
"""node -> per (label, n, k) its part call, depending on (the rule, the metas of its tensors)."""


def _part_call(g: Graph, v: int, rule: DimRule, label: str, n: int, k: int) -> PartCall:
    """split_node_args(g, v, rule, label, n, k), cached per node object: it reads the node, the
    rule and the metas of the node's tensors only, so a node expanded again (another state of
    an optimizer search) with an equal rule and equal metas gets the same part call."""
    node = g.nodes[v]
    tensors = g.tensors
    metas = tuple([tensors[t] for t in node.input_tuple] + [tensors[t] for t in node.output_tuple])
    depends = (rule, metas)
    call = _PART_CALLS.get(node, depends, slot=(label, n, k))
    if call is None:
        call = split_node_args(g, v, rule, label, n, k)
        _PART_CALLS.put(node, call, depends, slot=(label, n, k))
    return call


def _check(g: Graph) -> None:
    """Graph.check, with the shape check run once per distinct call.

    check_graph re-runs every node on FakeTensors of its inputs and compares the outputs'
    shapes and dtypes with the graph's; the parts of a region and repeated layers make the
    same call on the same input layouts with the same expected outputs, and such a call passes
    or fails alike. Nodes are visited in order as check_graph does, so the first failing node
    (and its message) is the same.
    """
    check_graph(g, infer_shapes=False)
    passed: set[tuple[Any, ...]] = set()
    with FakeTensorMode(allow_non_fake_inputs=False):
        for nid in g.order:
            if g.is_opaque(nid):
                continue
            key = _check_key(g, g.nodes[nid])
            if key is not None and key in passed:
                continue
            _check_node_shapes(g, nid)
            if key is not None:
                passed.add(key)


def _check_key(g: Graph, node: Node) -> tuple[Any, ...] | None:
    """What check_graph's shape check of `node` depends on: the op, its arguments (tensors as
    input positions), its inputs' shapes, strides and dtypes, and its outputs' shapes and
    dtypes; None if an argument cannot be keyed exactly."""
    inputs = node.input_ids()
    position = {t: i for i, t in enumerate(inputs)}
    try:
        args = encode(node.args, position)
        kwargs = encode(node.kwargs, position)
    except Unhashable:
        return None
    layouts = tuple((m.shape, m.stride, m.dtype) for m in (g.tensors[t] for t in inputs))
    outputs = tuple(None if t is None else (g.tensors[t].shape, g.tensors[t].dtype)
                    for t in node.outputs)
    return node.op, args, kwargs, layouts, outputs


def _pure_view(g: Graph, nid: int) -> bool:
    """A view op that writes nothing: running it on the merged base gives the merged view."""
    info = lookup(g.nodes[nid].op)
    return info is not None and info.kind is OpKind.VIEW and not g.mutated_tensors(nid)


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides: list[int] = []
    acc = 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))
