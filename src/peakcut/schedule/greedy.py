"""Greedy memory-aware list scheduling: fast, for graphs or partitions too large for the DP.

At each step one ready node runs. Nodes that do not grow memory (they free as
much as they allocate: in-place updates, the last reader of a big tensor) run
first, in capture order; a node that grows memory waits until no such node is
ready, and then the one needed soonest runs. "Needed" is measured by the
capture position of the node's earliest successor, so a node whose result is
used much later (a factory, a cast of a weight, a mask) is run late, just
before its use. Priorities change as other nodes run (a node becomes the last
reader of a storage), so they are kept in a heap with lazy invalidation.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from peakcut.schedule.problem import Problem


def greedy_order(problem: Problem, nodes: Sequence[int] | None = None,
                 position: Sequence[int] | np.ndarray | None = None) -> list[int]:
    """A topological order of `nodes` (default: all), built greedily as described above.

    nodes: a set that runs contiguously inside a reference order whose
    positions (per node index) are `position`; outside nodes before the set are
    taken as already run, those after it as run later.
    """
    members = list(range(problem.n)) if nodes is None else sorted(nodes)
    inside = set(members)
    lo = min((position[v] for v in members), default=0) if position is not None else 0
    waiting = {v: sum(1 for p in problem.preds[v] if p in inside) for v in members}
    remaining: dict[int, int] = {}   # storage -> touchers inside not run yet
    started: dict[int, bool] = {}    # storage -> touched before the set
    kept: dict[int, bool] = {}       # storage -> touched after the set (or a program output)
    for v in members:
        for k in problem.node_storages[v]:
            if k in remaining:
                continue
            outside = [t for t in problem.touches[k] if t not in inside]
            remaining[k] = len(problem.touches[k]) - len(outside)
            started[k] = position is not None and any(position[t] < lo for t in outside)
            kept[k] = bool(problem.to_end[k]) or (
                position is not None and any(position[t] > lo for t in outside))
    full = dict(remaining)
    version = dict.fromkeys(members, 0)
    heap: list[tuple[int, int, int, int]] = []

    def priority(v: int) -> tuple[int, int]:
        grow = 0
        for k in problem.node_storages[v]:
            if not started[k] and remaining[k] == full[k]:
                grow += int(problem.size[k])
            elif remaining[k] == 1 and not kept[k]:
                grow -= int(problem.size[k])
        if grow <= 0:
            return 0, v
        return 1, min((s for s in problem.succs[v] if s in inside), default=v)

    def push(v: int) -> None:
        version[v] += 1
        cls, key = priority(v)
        heapq.heappush(heap, (cls, key, v, version[v]))

    for v in members:
        if waiting[v] == 0:
            push(v)
    order: list[int] = []
    while heap:
        _, _, v, ver = heapq.heappop(heap)
        if ver != version[v] or waiting[v] < 0:
            continue
        order.append(v)
        waiting[v] = -1
        touched: set[int] = set()
        for k in problem.node_storages[v]:
            remaining[k] -= 1
            if remaining[k] <= 1:
                touched.update(t for t in problem.touches[k] if t in inside and waiting[t] == 0)
        for s in problem.succs[v]:
            if s in inside:
                waiting[s] -= 1
                if waiting[s] == 0:
                    touched.add(s)
        for t in touched:
            push(t)
    return order
