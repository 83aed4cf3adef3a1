"""What a region of a fission hands to the rest of the step, and what runs around it.

For a region S about to be expanded (peakcut.fission.region): the outside nodes interleaved
with S in the order (those S depends on go before it, the others after: convexity makes that
possible), the members each part must run (views of S read only outside S run whole after the
parts instead), and the boundary outputs with the merge that rebuilds each from the parts;
anything that cannot be rebuilt exactly is refused with a FissionError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from peakcut.fission.expanded import FissionError
from peakcut.fission.trans import pure_view
from peakcut.ir.dims import CAT, SAME, DimRule
from peakcut.ir.graph import Graph
from peakcut.transform.rewrite import describe_node, describe_tensor

SUPPORTED_MERGES = (CAT, SAME, "sum", "mean", "nll_mean")
"""How boundary outputs can be rebuilt from the parts (DimRule.combine kinds)."""


@dataclass(frozen=True)
class BoundaryOutput:
    """A boundary output of a region and how the parts rebuild it."""

    tensor: int
    producer: int
    index: int          # position in the producer's outputs
    kind: str           # CAT, SAME, "sum", "mean", "nll_mean"
    dim: int | None     # the L dimension of a CAT output
    writer: int         # the last node of the region writing the tensor's storage


def interleaved(g: Graph, nodes: frozenset[int], segment: list[int],
                fid: int) -> tuple[list[int], list[int]]:
    """Outside nodes between the region's first and last node: (S depends on them, others)."""
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


def copied_members(g: Graph, members: list[int], replayed: frozenset[int],
                   control: Mapping[int, tuple[int, ...]]) -> list[int]:
    """The members each part runs: all but the replayed views no part node needs (read,
    directly or through other views, or waited for by a control edge)."""
    needed: set[int] = set()
    awaited: set[int] = set()
    for v in reversed(members):    # readers and waiters come later in the order
        if v in replayed and v not in awaited and not any(
                u in needed for t in g.nodes[v].output_ids() for u in g.users(t)):
            continue
        needed.add(v)
        awaited.update(control[v])
    return [v for v in members if v in needed]


def boundary(g: Graph, rules: Mapping[int, DimRule], nodes: frozenset[int], members: list[int],
             labels: Mapping[int, str], produced: Mapping[int, int],
             ) -> tuple[list[BoundaryOutput], frozenset[int]]:
    """The tensors to preallocate and merge, and the view nodes replayed after the parts.

    A tensor leaving S (read outside or returned) that is a view of a tensor of S is not
    merged itself: its view op is replayed on the merged base after the last part (the
    original node, unchanged), and the base is merged instead. In-place results leaving S
    are refused (replaying would apply the write twice), and so is every merge that is not
    exact.
    """
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
        if not pure_view(g, v):
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
    outs: list[BoundaryOutput] = []
    seen_storages: dict[int, int] = {}
    for v in members:
        node = g.nodes[v]
        rule, label = rules[v], labels[v]
        if label not in rule.labels():
            raise FissionError(f"{describe_node(g, v)} does not carry label {label!r} in its rule")
        combine = rule.combine(label)
        for j, out in enumerate(node.outputs):
            if out is None or out not in merged:
                continue
            meta = g.tensors[out]
            kind = combine[j]
            if kind == "nll_mean":
                if len(node.outputs) != 2 or j not in (0, 1):
                    raise FissionError(f"{describe_node(g, v)}: merge 'nll_mean' expects the outputs "
                                       "(loss, total_weight)")
                kind = "nll_mean" if j == 0 else "sum"   # total weights add up
            if kind not in SUPPORTED_MERGES:
                raise FissionError(f"{describe_tensor(g, out)} of {describe_node(g, v)} leaves the region with "
                                   f"merge kind {kind!r}, which the expansion does not support")
            if meta.storage_offset != 0:
                raise FissionError(f"{describe_tensor(g, out)} of {describe_node(g, v)} leaves the region at "
                                   "an offset in its storage: it cannot be preallocated")
            if meta.storage in seen_storages:
                other = describe_tensor(g, seen_storages[meta.storage])
                raise FissionError(f"{describe_tensor(g, out)} and {other} leave the region in one "
                                   "storage")
            seen_storages[meta.storage] = out
            writer = max([v, *writes.get(meta.storage, [])], key=position.__getitem__)
            dim = rule.outputs[j].index(label) if kind == CAT else None
            outs.append(BoundaryOutput(out, v, j, kind, dim, writer))
    return outs, frozenset(replayed)
