"""Serenity-style dynamic programming over the orders of a window of nodes.

The window is a set of nodes that runs contiguously between a fixed prefix
and a fixed suffix (a partition, or an interval of a previous schedule). A DP
state is the set of window nodes already run (a bitmask); the live memory
after a state does not depend on how it was reached, so for each state only
the smallest peak so far matters (Ahn et al., "Ordering chaos", MLSys'20).

Pruning: a state whose peak exceeds `bound` is dropped (the bound is usually
the window peak of a known order, so that order always survives). Memory/time
bound: at most `max_states` states per layer (the best by peak, then live
bytes, are kept; the result is then marked inexact) and a wall-clock limit,
after which the caller falls back to a greedy order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from peakcut.schedule.problem import Problem
from peakcut.schedule.reach import members


@dataclass(frozen=True)
class WindowResult:
    order: list[int]       # node indices of the window, in the new order
    peak_bytes: int        # peak while the window runs (absolute bytes)
    exact: bool            # True: no state was dropped by the caps (optimal within the window)
    states: int            # DP states expanded


class DPTimeout(RuntimeError):
    """The DP ran past its time limit."""


@dataclass(frozen=True)
class WindowContext:
    """What a window needs to know about the rest of the order."""

    nodes: list[int]                 # window node indices (any order)
    base_bytes: int                  # bytes live when the window starts (incl. caller-held)
    local: dict[int, int]            # node index -> bit position
    preds: list[int]                 # per local node: mask of local predecessors
    succs: list[list[int]]           # per local node: local successors
    alloc: list[list[tuple[int, int]]]   # per local node: (touch mask, bytes) of storages it may allocate
    free: list[list[tuple[int, int]]]    # per local node: (touch mask, bytes) of storages it may free
    workspace: list[int]


def window_context(problem: Problem, order: Sequence[int], start: int, stop: int,
                   first: np.ndarray, last: np.ndarray) -> WindowContext:
    """Context of the window order[start:stop]; first/last: storage intervals of `order`."""
    nodes = list(order[start:stop])
    local = {v: i for i, v in enumerate(nodes)}
    preds = [0] * len(nodes)
    succs: list[list[int]] = [[] for _ in nodes]
    for v, i in local.items():
        for p in problem.preds[v]:
            j = local.get(p)
            if j is not None:
                preds[i] |= 1 << j
                succs[j].append(i)
    alloc: list[list[tuple[int, int]]] = [[] for _ in nodes]
    free: list[list[tuple[int, int]]] = [[] for _ in nodes]
    live_at_start = (first < start) & (last >= start)
    base = problem.baseline + int(problem.size[live_at_start].sum())
    seen: set[int] = set()
    for v in nodes:
        for k in problem.node_storages[v]:
            if k in seen:
                continue
            seen.add(k)
            mask = 0
            for t in problem.touches[k]:
                j = local.get(t)
                if j is not None:
                    mask |= 1 << j
            size = int(problem.size[k])
            before = first[k] < start
            after = last[k] >= stop
            for j in members(mask):
                if not before:
                    alloc[j].append((mask, size))
                if not after:
                    free[j].append((mask, size))
    return WindowContext(nodes, base, local, preds, succs, alloc, free,
                         [int(problem.workspace[v]) for v in nodes])


def window_peak(ctx: WindowContext, local_order: Sequence[int]) -> int:
    """Peak of running the window in `local_order` (local indices)."""
    done = 0
    mem = ctx.base_bytes
    peak = ctx.base_bytes
    for j in local_order:
        mem, step = _step(ctx, done, mem, j)
        peak = max(peak, step)
        done |= 1 << j
    return peak


def _step(ctx: WindowContext, done: int, mem: int, j: int) -> tuple[int, int]:
    """(live bytes after running j, bytes while j runs), given the set `done` already run."""
    bit = 1 << j
    grow = sum(size for mask, size in ctx.alloc[j] if not mask & done)
    after = done | bit
    shrink = sum(size for mask, size in ctx.free[j] if not mask & ~after)
    return mem + grow - shrink, mem + grow + ctx.workspace[j]


def dp_window(ctx: WindowContext, bound: int, max_states: int = 2048,
              deadline: float | None = None) -> WindowResult | None:
    """Min-peak order of the window, or None when every order exceeds `bound`.

    Raises DPTimeout when `deadline` (time.perf_counter value) passes.
    """
    m = len(ctx.nodes)
    full = (1 << m) - 1
    initial_ready = 0
    for j in range(m):
        if not ctx.preds[j]:
            initial_ready |= 1 << j
    # state -> (peak, live bytes, ready mask, parent state, node run last)
    layer: dict[int, tuple[int, int, int, int, int]] = {0: (ctx.base_bytes, ctx.base_bytes, initial_ready, -1, -1)}
    history: list[dict[int, tuple[int, int, int, int, int]]] = [layer]
    exact = True
    expanded = 0
    for _ in range(m):
        nxt: dict[int, tuple[int, int, int, int, int]] = {}
        for done, (peak, mem, ready, _, _) in layer.items():
            expanded += 1
            for j in members(ready):
                mem2, step = _step(ctx, done, mem, j)
                peak2 = peak if peak >= step else step
                if peak2 > bound:
                    continue
                state = done | 1 << j
                old = nxt.get(state)
                if old is not None and (old[0], old[1]) <= (peak2, mem2):
                    continue
                ready2 = ready & ~(1 << j)
                for s in ctx.succs[j]:
                    if not ctx.preds[s] & ~state:
                        ready2 |= 1 << s
                nxt[state] = (peak2, mem2, ready2, done, j)
        if not nxt:
            return None
        if len(nxt) > max_states:
            exact = False
            kept = sorted(nxt.items(), key=lambda kv: (kv[1][0], kv[1][1]))[:max_states]
            nxt = dict(kept)
        if deadline is not None and time.perf_counter() > deadline:
            raise DPTimeout(f"window of {m} nodes: DP exceeded its time limit")
        history.append(nxt)
        layer = nxt
    peak = layer[full][0]
    local_order: list[int] = []
    state = full
    for level in range(m, 0, -1):
        entry = history[level][state]
        local_order.append(entry[4])
        state = entry[3]
    local_order.reverse()
    return WindowResult([ctx.nodes[j] for j in local_order], peak, exact, expanded)
