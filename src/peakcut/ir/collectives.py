"""peakcut's collective ops: torch.distributed's collectives as graph nodes.

A data-parallel step all-reduces its gradients (and broadcasts its buffers) through these
ops. Each collective is two nodes: the op that starts it (`peakcut::all_reduce_` and
`peakcut::broadcast_` in place on a tensor; the functional collectives' all-gather and
reduce-scatter into a new one, as DTensor's redistribution of an FSDP2 parameter traces
them), and `peakcut::wait_collective`, which waits for the collective that writes that
tensor to complete. Between the two the collective runs
on its own stream beside compute (simulate/streams.py), and readers of the tensor come after
the wait (both nodes write the tensor, so capture's storage edges order them).

They run on torch.distributed's own engine: the functional collectives
(`torch.ops._c10d_functional`, which start the collective on the process group named by
`group_name` and keep its work until `wait_tensor`), NCCL on GPUs and gloo on CPUs. The
arguments name the group and its size, so the step is priced without a process group (the
size sets the ring's steps) and runs on any rank that has the group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from peakcut.ir.graph import Graph
from peakcut.ir.registry import OpKind, lookup

ALL_REDUCE_OP = "peakcut.all_reduce_.default"
BROADCAST_OP = "peakcut.broadcast_.default"
WAIT_OP = "peakcut.wait_collective.default"
ALL_GATHER_OP = "_c10d_functional.all_gather_into_tensor.default"
REDUCE_SCATTER_OP = "_c10d_functional.reduce_scatter_tensor.default"
STARTS = (ALL_REDUCE_OP, BROADCAST_OP, ALL_GATHER_OP, REDUCE_SCATTER_OP)
COLLECTIVE_OPS = (*STARTS, WAIT_OP)
_SIZE_ARGUMENT = {ALL_GATHER_OP: 1, REDUCE_SCATTER_OP: 2}    # the others: the last argument


@torch.library.custom_op("peakcut::all_reduce_", mutates_args=("tensor",))
def all_reduce_(tensor: torch.Tensor, reduce_op: str, group_name: str, world_size: int) -> None:
    """Start an all-reduce (`reduce_op`: 'sum', 'avg', ...) of `tensor` in place over the
    process group `group_name` of `world_size` ranks; wait_collective waits for it."""
    torch.ops._c10d_functional.all_reduce_(tensor, reduce_op, group_name)


@all_reduce_.register_fake
def _all_reduce_fake(tensor: torch.Tensor, reduce_op: str, group_name: str, world_size: int) -> None:
    return None


@torch.library.custom_op("peakcut::broadcast_", mutates_args=("tensor",))
def broadcast_(tensor: torch.Tensor, src: int, group_name: str, world_size: int) -> None:
    """Start a broadcast of rank `src`'s `tensor` into every rank's `tensor` over the process
    group `group_name`; wait_collective waits for it."""
    torch.ops._c10d_functional.broadcast_(tensor, src, group_name)


@broadcast_.register_fake
def _broadcast_fake(tensor: torch.Tensor, src: int, group_name: str, world_size: int) -> None:
    return None


@torch.library.custom_op("peakcut::wait_collective", mutates_args=("tensor",))
def wait_collective(tensor: torch.Tensor) -> None:
    """Wait until the collective started on `tensor` has written it."""
    torch.ops._c10d_functional.wait_tensor(tensor)


@wait_collective.register_fake
def _wait_fake(tensor: torch.Tensor) -> None:
    return None


def is_collective(op: str) -> bool:
    """Whether `op` starts a collective (it runs on the communication stream)."""
    return op in STARTS


def world_size_of(op: str, args: tuple[object, ...]) -> int:
    """The group size a start's arguments name."""
    size = args[_SIZE_ARGUMENT.get(op, -1)]
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"a collective's last argument is its group size, got {size!r}")
    return size


def _views_then_first_reader(g: Graph, wait: int, position: dict[int, int]) -> tuple[list[int], int]:
    """The views (and views of views) of the tensor `wait` waits for that come before the
    first node after the wait that reads data from it, and that node's position (the order's
    end if none)."""
    views: set[int] = set()
    readers: list[int] = []
    frontier = [wait]
    while frontier:
        for nid in g.successors(frontier.pop()):
            info = lookup(g.nodes[nid].op)
            if info is not None and info.kind is OpKind.VIEW:
                if nid not in views:
                    views.add(nid)
                    frontier.append(nid)
            else:
                readers.append(position[nid])
    first = min(readers, default=len(position))
    return sorted((v for v in views if position[v] < first), key=position.__getitem__), first


def overlapped_order(g: Graph, order: Sequence[int]) -> list[int]:
    """`order` with every collective started as soon as what it reads is ready and waited for
    just before the first node that depends on it, so compute runs while it is in flight.

    Neither move changes memory: a start and a wait allocate and free nothing, and the
    tensor they work on is read after the wait in either order. Code generation and the
    timeline both run the step in this order. Without collectives, `order` itself.
    """
    nodes = g.nodes
    moved = [nid for nid in order if nid in nodes and nodes[nid].op in COLLECTIVE_OPS]
    if not moved or len(set(order)) != len(nodes) or any(nid not in nodes for nid in order):
        return list(order)          # (an order that is not one of g's nodes is the caller's to refuse)
    position = {n: i for i, n in enumerate(order)}
    key: dict[int, tuple[float, int, int]] = {n: (float(i), 0, i) for i, n in enumerate(order)}
    shifted = list(moved)
    for nid in moved:
        if nodes[nid].op == WAIT_OP:
            # the views of the waited tensor move with the wait: they read no data
            views, first = _views_then_first_reader(g, nid, position)
            anchor = first - 0.5
            key[nid] = (anchor, 0, position[nid])
            for v in views:
                key[v] = (anchor, 1, position[v])
            shifted.extend(views)
        else:
            before = [position[p] for p in g.predecessors(nid)]
            key[nid] = ((max(before) + 0.5) if before else -0.5, 0, position[nid])
    out = sorted(order, key=lambda n: (key[n], position[n]))
    placed = {n: i for i, n in enumerate(out)}
    for nid in shifted:       # moved next to another moved node: keep the order as it was
        if any(placed[p] > placed[nid] for p in g.predecessors(nid)) or any(
                placed[s] < placed[nid] for s in g.successors(nid)):
            return list(order)
    return out
