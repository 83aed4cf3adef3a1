"""peakcut's collective ops: torch.distributed's collectives as graph nodes.

A data-parallel step all-reduces its gradients (and broadcasts its buffers) through these
ops. Each collective is two nodes: the op that starts it on a tensor in place
(`peakcut::all_reduce_`, `peakcut::broadcast_`), and `peakcut::wait_collective`, which waits
for the collective started on that tensor to complete. Between the two the collective runs
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

ALL_REDUCE_OP = "peakcut.all_reduce_.default"
BROADCAST_OP = "peakcut.broadcast_.default"
WAIT_OP = "peakcut.wait_collective.default"
STARTS = (ALL_REDUCE_OP, BROADCAST_OP)
COLLECTIVE_OPS = (*STARTS, WAIT_OP)


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


def world_size_of(args: tuple[object, ...]) -> int:
    """The group size a start's arguments name (its last argument)."""
    size = args[-1]
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"a collective's last argument is its group size, got {size!r}")
    return size


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
    key = {n: float(i) for i, n in enumerate(order)}
    for nid in moved:
        if nodes[nid].op == WAIT_OP:
            after = [position[s] for s in g.successors(nid)]
            key[nid] = min(after) - 0.5 if after else len(order) + 0.5
        else:
            before = [position[p] for p in g.predecessors(nid)]
            key[nid] = max(before) + 0.5 if before else -0.5
    out = sorted(order, key=lambda n: (key[n], position[n]))
    placed = {n: i for i, n in enumerate(out)}
    for nid in moved:         # moved next to another moved node: keep the order as it was
        if any(placed[p] > placed[nid] for p in g.predecessors(nid)) or any(
                placed[s] < placed[nid] for s in g.successors(nid)):
            return list(order)
    return out
