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


@torch.library.custom_op("peakcut::all_gather_into_tensor", mutates_args=())
def all_gather_into_tensor(shard: torch.Tensor, world_size: int, group_name: str) -> torch.Tensor:
    """ALL_GATHER_OP as generated programs run it: the functional all-gather of `shard` over
    the group `group_name`, waited for at once where gloo runs it, so that no
    two gloo all-gathers are in flight: with three or more in flight, torch 2.13's gloo
    corrupts the process's heap (`malloc(): unaligned tcache chunk detected`, or a segfault;
    two gloo ranks issuing nine functional all-gathers of float64 tensors before waiting for
    them crash within a few thousand rounds; reduce-scatters and all-reduces in flight do
    not). The wait_collective that follows then finds the collective done; the result is
    allocated at the same point either way, so the step's memory does not change."""
    gathered: torch.Tensor = torch.ops._c10d_functional.all_gather_into_tensor(shard, world_size, group_name)
    if _backend(group_name, shard.device) == "gloo":
        torch.ops._c10d_functional.wait_tensor(gathered)
    return gathered


@all_gather_into_tensor.register_fake
def _all_gather_fake(shard: torch.Tensor, world_size: int, group_name: str) -> torch.Tensor:
    return shard.new_empty((shard.shape[0] * world_size, *shard.shape[1:]))


def _backend(group_name: str, device: torch.device) -> str:
    """The backend that runs `device`'s tensors in the process group named `group_name`
    ('gloo', 'nccl'), also where the group was made without naming one."""
    from torch.distributed import distributed_c10d

    group = distributed_c10d._resolve_process_group(distributed_c10d.GroupName(group_name))
    return str(group._get_backend(device).name())


RUN_AS = {ALL_GATHER_OP: "peakcut.all_gather_into_tensor.default"}
"""The op a generated program calls for a node's op, where it is not the op itself."""


@torch.library.custom_op("peakcut::wait_collective", mutates_args=("tensor",))
def wait_collective(tensor: torch.Tensor, reads: Sequence[torch.Tensor]) -> None:
    """Wait until the collective started on `tensor` has written it. `reads`: the tensors the
    collective reads until then (a functional collective's input; none for one in place), so
    that the graph keeps them alive as long as the collective does; the wait does nothing
    with them."""
    torch.ops._c10d_functional.wait_tensor(tensor)


@wait_collective.register_fake
def _wait_fake(tensor: torch.Tensor, reads: Sequence[torch.Tensor]) -> None:
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


IN_PLACE_STARTS = (ALL_REDUCE_OP, BROADCAST_OP)


def _started_by(g: Graph, wait: int) -> int | None:
    """The start whose collective `wait` waits for (None if none is found)."""
    tensor = g.nodes[wait].input_tuple[0]
    producer = g.producer(tensor)
    if producer is not None and g.nodes[producer].op in STARTS:
        return producer
    starts = [w for w in g.storage_writers(g.tensors[tensor].storage) if g.nodes[w].op in IN_PLACE_STARTS]
    return starts[-1] if starts else None


def _first_data_read(g: Graph, gather: int, position: dict[int, int]) -> int:
    """The position of the first node that reads the data all-gather `gather` makes (after
    its wait and views; the order's end where nothing does)."""
    out = g.nodes[gather].outputs[0]
    waits = [u for u in g.users(out) if g.nodes[u].op == WAIT_OP] if out is not None else []
    return min((_views_then_first_reader(g, w, position)[1] for w in waits), default=len(position))


def _scatter_chain(g: Graph, scatter: int) -> list[int]:
    """Reduce-scatter `scatter` and the views of the gradient it reads that only it reads
    (what moves with its start)."""
    chain, todo = [scatter], list(g.nodes[scatter].input_tuple)
    while todo:
        p = g.producer(todo.pop())
        if p is None or p in chain:
            continue
        info = lookup(g.nodes[p].op)
        if info is None or info.kind is not OpKind.VIEW:
            continue
        if all(u in chain or g.nodes[u].op == WAIT_OP for t in g.nodes[p].output_tuple for u in g.users(t)):
            chain.append(p)
            todo.extend(g.nodes[p].input_tuple)
    return chain


def _gathers_issued(g: Graph, order: Sequence[int], position: dict[int, int], window: int | None
                    ) -> dict[int, float]:
    """Where each all-gather is issued (a position between two of `order`'s): in the order of
    their first readers, gather k right before the first reader of the earliest gather j
    such that gathers j..k hold at most `window` bytes, so the gathered data that waits for
    its readers stays within the window (FSDP2's prefetch of the next unit); None: twice the
    largest gather."""
    first_read = {n: _first_data_read(g, n, position) for n in order if g.nodes[n].op == ALL_GATHER_OP}
    gathers = sorted(first_read, key=lambda n: (first_read[n], position[n]))
    sizes = [g.tensors[t].nbytes if (t := g.nodes[n].outputs[0]) is not None else 0 for n in gathers]
    limit = 2 * max(sizes, default=0) if window is None else window
    issued: dict[int, float] = {}
    j, ahead = 0, 0                   # right before gather j is read, gathers j..k are unread; their bytes
    for k, nid in enumerate(gathers):
        ahead += sizes[k]
        while ahead > limit and j < k:
            ahead -= sizes[j]
            j += 1
        issued[nid] = first_read[gathers[j]] - 0.75
    return issued


def overlapped_order(g: Graph, order: Sequence[int], prefetch_bytes: int | None = None) -> list[int]:
    """`order` with the collectives moved so that compute runs while they are in flight, as
    code generation and the timeline both run the step:

    - an in-place collective (ALL_REDUCE_OP, BROADCAST_OP: DDP's buckets and buffers) starts
      as soon as what it reads is ready; moving it allocates and frees nothing;
    - a reduce-scatter (and the views of the gradient only it reads) starts as soon as its
      gradient is made, as FSDP2 reduce-scatters a unit's gradients when its backward ends;
    - an all-gather starts as early as the gathered data not yet read stays within
      `prefetch_bytes` (default: twice the largest gather), in the order the gathers are
      read, as FSDP2 prefetches the next unit: its result is allocated that much before it
      is read, which the memory curve of this order counts;
    - a wait goes right before the first node that reads what it waits for (the views of
      that tensor with it: they read no data), but a reduce-scatter's wait no later than the
      next reduce-scatter's start: its input, the full gradient, lives until its wait, and
      one reduce-scatter in flight at a time keeps one such gradient, as FSDP2 does.

    Without collectives, `order` itself.
    """
    nodes = g.nodes
    if not any(nid in nodes and nodes[nid].op in COLLECTIVE_OPS for nid in order):
        return list(order)
    if len(set(order)) != len(nodes) or any(nid not in nodes for nid in order):
        return list(order)          # (an order that is not one of g's nodes is the caller's to refuse)
    position = {n: i for i, n in enumerate(order)}
    key: dict[int, tuple[float, int, int]] = {n: (float(i), 0, i) for i, n in enumerate(order)}
    shifted: list[int] = []
    for nid, ahead in _gathers_issued(g, order, position, prefetch_bytes).items():
        key[nid] = (max(ahead, *(position[p] + 0.5 for p in g.predecessors(nid))), 0, position[nid])
        shifted.append(nid)
    scatter_start: dict[int, float] = {}
    for nid in order:
        if nodes[nid].op != REDUCE_SCATTER_OP:
            continue
        chain = _scatter_chain(g, nid)
        inside = set(chain)
        ready = [position[p] for v in chain for p in g.predecessors(v) if p not in inside]
        anchor = min(max(ready, default=-1) + 0.5, float(position[nid]))
        scatter_start[nid] = anchor
        for v in chain:
            key[v] = (anchor, 0, position[v])
        shifted.extend(chain)
    starts = sorted(scatter_start.items(), key=lambda kv: (kv[1], position[kv[0]]))
    next_scatter = {a: b for (a, _), (b, _) in zip(starts, starts[1:], strict=False)}
    for nid in order:
        op = nodes[nid].op
        if op in IN_PLACE_STARTS:
            before = [position[p] for p in g.predecessors(nid)]
            key[nid] = ((max(before) + 0.5) if before else -0.5, 0, position[nid])
            shifted.append(nid)
        elif op == WAIT_OP:
            start = _started_by(g, nid)
            if start is None:
                continue
            views, first = _views_then_first_reader(g, nid, position)
            here = (first - 0.5, 0, position[nid])
            after = next_scatter.get(start)
            if after is not None and key[after] < here:
                here = (key[after][0], 0, position[nid])    # before the next start: it sorts by position
                views = [v for v in views if key[v] < here]
            key[nid] = here
            for v in views:
                key[v] = (here[0], 1, position[v])
            shifted.extend((nid, *views))
    out = sorted(order, key=lambda n: (key[n], position[n]))
    placed = {n: i for i, n in enumerate(out)}
    for nid in shifted:       # moved next to another moved node: keep the order as it was
        if any(placed[p] > placed[nid] for p in g.predecessors(nid)) or any(
                placed[s] < placed[nid] for s in g.successors(nid)):
            return list(order)
    return out
