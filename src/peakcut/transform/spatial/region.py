"""Which nodes form a spatial region, in what order, and why a set of nodes cannot be one:
every node an op the region may hold, what it hands on owning its storage, enough rows for
the parts, one convex block in the order, and every part able to make what it needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.transform.rewrite import describe_node, describe_tensor, positions
from peakcut.transform.spatial.halos import needs
from peakcut.transform.spatial.ops import (
    CONV_BACKWARD,
    NLL_FORWARD,
    ROWS,
    is_pointwise,
    owned,
    reads_grad_input_inside,
    why_not_node,
)


@dataclass(frozen=True)
class Region:
    """The nodes of a region and the tensors it hands on."""

    nodes: tuple[int, ...]            # in `order`
    rows: tuple[int, ...]             # outputs handed on whose rows the parts write (copy_)
    added: tuple[int, ...]            # outputs handed on that the parts add into (grad_input, weight, bias)


def find_region(g: Graph, order: Sequence[int], nodes: Sequence[int], n: int) -> Region | str:
    """`nodes` as a region of `n` parts, or why they cannot be one (naming the node)."""
    if not nodes:
        return "no nodes given"
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        return f"n={n!r}: expected a number of parts >= 2"
    missing = [v for v in nodes if v not in g.nodes]
    if missing:
        return f"node {missing[0]} is not in the graph"
    for v in nodes:
        reason = why_not_node(g, v)
        if reason:
            return reason
    pos = positions(order)
    members = tuple(sorted(set(nodes), key=pos.__getitem__))
    inside = set(members)
    program = set(g.outputs)
    rows: list[int] = []
    added: list[int] = []
    for v in members:
        node = g.nodes[v]
        for j, t in enumerate(node.outputs):     # one output, a convolution's backward's three, a loss's two
            if t is None:
                continue
            outside = [u for u in g.users(t) if u not in inside]
            inner = [u for u in g.users(t) if u in inside]
            summed = node.op == NLL_FORWARD or (node.op == CONV_BACKWARD
                                                 and not (j == 0 and inner and is_pointwise(g, node)))
            if summed:                 # the parts add up to it: a gradient, a loss or its count
                if inner:
                    hint = (" (peakcut.fission.loss.detach_loss computes a mean loss's count up front)"
                            if node.op == NLL_FORWARD else "")
                    return (f"{describe_node(g, inner[0])} reads {describe_tensor(g, t)}, which the parts of "
                            f"{describe_node(g, v)} only add up to: it must be read outside the region{hint}")
                if node.op == NLL_FORWARD and not (outside or t in program):
                    continue
                added.append(t)
            elif outside or t in program:
                rows.append(t)
            else:
                continue
            meta = g.tensors[t]
            if meta.storage_offset != 0 or g.storage_owner_of(meta.storage) != v:
                return f"{describe_tensor(g, t)} of {describe_node(g, v)} does not own its storage"
    for t in rows:
        if g.tensors[t].shape[ROWS] < n:
            return f"{describe_tensor(g, t)} has {g.tensors[t].shape[ROWS]} rows: fewer than n={n} parts"
    for v in members:
        if g.nodes[v].op == CONV_BACKWARD:
            go = g.nodes[v].args[0]
            if isinstance(go, TensorRef) and g.tensors[go.id].shape[ROWS] < n:
                return f"the grad_output of {describe_node(g, v)} has fewer rows than n={n} parts"
    for v in members:
        if g.nodes[v].op == NLL_FORWARD and g.tensors[g.nodes[v].args[0].id].shape[ROWS] < n:
            return f"the scores {describe_node(g, v)} reads have fewer rows than n={n} parts"
    for seq in (order, g.order):
        reason = _why_not_convex(g, seq, inside)
        if reason:
            return reason
    region = Region(members, tuple(rows), tuple(added))
    return _why_not_exact(g, region, n) or region


def _why_not_exact(g: Graph, region: Region, n: int) -> str | None:
    """Why some part could not make what it needs: a tensor made in the region that no part
    needs rows of, though it is read there (as a whole: a convolution's weight, a broadcast
    [N, C, 1, 1] input), or a pointwise backward's grad_input rows beyond its own grad_output
    rows (a halo of it)."""
    inside = set(region.nodes)
    first = needs(g, region.nodes, region.rows, 0, n)      # the same tensors get rows in every part
    for v in region.nodes:
        node = g.nodes[v]
        if node.op in (CONV_BACKWARD, NLL_FORWARD):
            continue
        (out,) = node.output_ids()
        if out not in first and any(u in inside for u in g.users(out)):
            return (f"{describe_tensor(g, out)} of {describe_node(g, v)} is read in the region only whole "
                    "(not along its rows): make it outside the region")
    backs = [g.nodes[v] for v in region.nodes
             if g.nodes[v].op == CONV_BACKWARD and reads_grad_input_inside(g, g.nodes[v], inside)]
    for k in range(n if backs else 0):
        need = first if k == 0 else needs(g, region.nodes, region.rows, k, n)
        for node in backs:
            mine = owned(g.tensors[node.args[0].id].shape[ROWS], k, n)
            gi = node.outputs[0]
            rows = None if gi is None else need.get(gi)
            if rows is not None and (rows.start < mine.start or rows.stop > mine.stop):
                return (f"part {k} of {n} would need rows {rows.start}..{rows.stop} of the grad_input of "
                        f"{describe_node(g, node.id)}, beyond the rows {mine.start}..{mine.stop} it makes: "
                        "a halo of a gradient is not recomputed")
    return None


def downstream(g: Graph, seq: Sequence[int], inside: set[int]) -> list[int]:
    """The nodes between the region's first and last node in `seq` that depend on it: they
    run after the parts."""
    at = [i for i, v in enumerate(seq) if v in inside]
    after: set[int] = set()
    for u in seq[at[0]:at[-1]]:
        if u not in inside and any(p in inside or p in after for p in g.predecessors(u)):
            after.add(u)
    return [u for u in seq[at[0]:at[-1]] if u in after]


def _why_not_convex(g: Graph, seq: Sequence[int], inside: set[int]) -> str | None:
    """Why the region cannot run as one block at its last node in `seq` (None: it can)."""
    after = set(downstream(g, seq, inside))
    read = {g.tensors[t].storage for v in inside for t in g.nodes[v].input_ids()}
    at = [i for i, v in enumerate(seq) if v in inside]
    for u in seq[at[0]:at[-1] + 1]:           # the last node's inputs too
        if u in inside:
            if after.intersection(g.predecessors(u)):
                p = next(iter(after.intersection(g.predecessors(u))))
                return (f"{describe_node(g, u)} depends on {describe_node(g, p)}, which depends on the region: "
                        "the region is not convex")
        elif u not in after and {g.tensors[t].storage for t in g.mutated_tensors(u)} & read:
            return f"{describe_node(g, u)} writes in place what the region reads, between its nodes"
    return None


def why_not_split_rows(g: Graph, order: Sequence[int], nodes: Sequence[int], n: int) -> str | None:
    """Why `nodes` cannot run in `n` parts along their rows (None: split_rows applies)."""
    region = find_region(g, order, nodes, n)
    return region if isinstance(region, str) else None
