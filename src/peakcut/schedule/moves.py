"""Long-range moves: hill climbing by moving small blocks of nodes far in the order.

Windows (peakcut.schedule.dp) only reorder nodes locally. Some of the best
changes are global: an optimizer update run as soon as its gradient exists
frees the gradient for the rest of the backward pass (ROAM's weight-update
placement); a node whose output is only needed much later is best run just
before that use. Both are block moves:

- a *sink block* is a node with its few descendants (e.g. a parameter's whole
  update chain); it moves as early as its outside predecessors allow;
- a *source block* is a node with its few ancestors; it moves as late as its
  outside successors allow.

A move is kept when it lowers (peak, area under the memory curve); the
memory of every candidate order is evaluated exactly (Problem.curve).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from peakcut.memory.liveness import BoolArray, Int64Array
from peakcut.schedule.problem import Problem
from peakcut.schedule.reach import Reachability, _bits, members

BLOCK_LIMIT = 48  # largest block moved as one piece (nodes)


@dataclass(frozen=True)
class Block:
    nodes: frozenset[int]
    early: bool  # True: move as early as possible; False: as late as possible


def candidate_blocks(problem: Problem, reach: Reachability, limit: int = BLOCK_LIMIT) -> list[Block]:
    """Maximal small sink blocks and source blocks of the graph."""
    n = problem.n
    des_count = [reach.des[v].bit_count() for v in range(n)]
    anc_count = [reach.anc[v].bit_count() for v in range(n)]
    blocks: list[Block] = []
    for v in range(n):
        if des_count[v] < limit and all(des_count[p] >= limit for p in problem.preds[v]):
            blocks.append(Block(frozenset(members(reach.des[v]) + [v]), early=True))
        if anc_count[v] < limit and all(anc_count[s] >= limit for s in problem.succs[v]):
            blocks.append(Block(frozenset(members(reach.anc[v]) + [v]), early=False))
    return blocks


def _flags(n: int, nodes: Iterable[int]) -> BoolArray:
    """A bool array over node indices, True at `nodes`."""
    flags = np.zeros(n, dtype=np.bool_)
    flags[np.fromiter(nodes, dtype=np.int64)] = True
    return flags


def moved(problem: Problem, order: Int64Array, pos: Int64Array, block: Block) -> Int64Array | None:
    """`order` (node indices) with the block moved as far as allowed, or None if it cannot move."""
    members = block.nodes
    if block.early:
        limit = -1
        for v in members:
            for p in problem.preds[v]:
                if p not in members:
                    limit = max(limit, int(pos[p]))
        first = min(int(pos[v]) for v in members)
        if limit + 1 >= first:
            return None
        tail = order[limit + 1:]
        inside = _flags(problem.n, members)[tail]
        return np.concatenate((order[:limit + 1], tail[inside], tail[~inside]))
    limit = problem.n
    for v in members:
        for s in problem.succs[v]:
            if s not in members:
                limit = min(limit, int(pos[s]))
    last = max(int(pos[v]) for v in members)
    if limit - 1 <= last:
        return None
    head = order[:limit]
    inside = _flags(problem.n, members)[head]
    return np.concatenate((head[~inside], head[inside], order[limit:]))


def _mask(flags: np.ndarray) -> int:
    """The bitset (bit v = node v) of the True entries of a bool array."""
    return int.from_bytes(np.packbits(flags, bitorder="little").tobytes(), "little")


def hoist_blocks(problem: Problem, order: list[int], reach: Reachability, peak_index: int,
                 limit: int = BLOCK_LIMIT) -> Iterator[list[int]]:
    """Blocks that could run before the peak node but run after it, made one at a time.

    For each node w after the peak node p that does not depend on p, the block
    is w with its ancestors that also run after p (in order). Run just before
    p, such a block can free tensors that only it still reads (e.g. the parts
    of an activation's backward that do not need the incoming gradient).

    Each block costs its members, not a scan of the whole order: the caller
    stops at the first block that helps, and an order of 20k+ nodes has about
    as many blocks.
    """
    n = problem.n
    p = order[peak_index]
    after = order[peak_index + 1:]
    position = np.full(n, -1, dtype=np.int64)
    position[np.asarray(after, dtype=np.int64)] = np.arange(len(after), dtype=np.int64)
    later = _mask(position >= 0)
    below = _bits(reach.des[p], n)
    for w in after:
        if below[w]:
            continue
        block = (reach.anc[w] & later) | (1 << w)
        if block.bit_count() <= limit:
            yield sorted(members(block), key=position.__getitem__)


def hoisted(order: Int64Array, peak_index: int, block: list[int]) -> Int64Array:
    """`order` with `block` (nodes after the peak, closed under ancestors after it) run before the peak."""
    rest = order[peak_index:]
    return np.concatenate((order[:peak_index], np.asarray(block, dtype=np.int64),
                           rest[~_flags(len(order), block)[rest]]))


def improve_by_hoisting(problem: Problem, order: Sequence[int], reach: Reachability,
                        deadline: float, floor: int = 0) -> list[int]:
    """Hoist blocks over the peak while that lowers (peak, area).

    Candidate orders are numpy arrays: building and pricing one is a few vector operations
    over the order, not a Python pass (graphs of 20k+ nodes try thousands)."""
    best = np.asarray(order, dtype=np.int64)
    curve = problem.curve(best)
    score = (curve.peak_bytes, int(curve.timeline.sum()))
    improved = True
    while improved and time.perf_counter() < deadline and score[0] > floor:
        improved = False
        for block in hoist_blocks(problem, best.tolist(), reach, curve.peak_index):
            if time.perf_counter() > deadline:
                break
            candidate = hoisted(best, curve.peak_index, block)
            c = problem.curve(candidate)
            new = (c.peak_bytes, int(c.timeline.sum()))
            if new < score:
                best, score, curve, improved = candidate, new, c, True
                break
    found: list[int] = best.tolist()
    return found


def improve_by_moves(problem: Problem, order: Sequence[int], reach: Reachability,
                     deadline: float, floor: int = 0) -> list[int]:
    """Hill-climb over block moves until no move helps, `floor` is reached, or the deadline."""
    best = np.asarray(order, dtype=np.int64)
    pos = problem.to_positions(best)
    curve = problem.curve(best)
    score = (curve.peak_bytes, int(curve.timeline.sum()))
    blocks = candidate_blocks(problem, reach)
    improved = True
    while improved and time.perf_counter() < deadline and score[0] > floor:
        improved = False
        for block in blocks:
            if time.perf_counter() > deadline:
                break
            candidate = moved(problem, best, pos, block)
            if candidate is None:
                continue
            c = problem.curve(candidate)
            new = (c.peak_bytes, int(c.timeline.sum()))
            if new < score:
                best, score, improved = candidate, new, True
                pos = problem.to_positions(best)
    found: list[int] = best.tolist()
    return found
