"""Reachability as bitsets: ancestors, descendants, narrow-waist values, an order-free lower bound.

Sets of node indices are Python ints used as bitsets (bit v = node v); on
graphs of ~10k nodes one set is ~1.2 KB and the whole table builds in well
under a second.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from peakcut.schedule.problem import Problem


class Reachability:
    """Ancestor and descendant sets of every node of a problem (or of a subset of its nodes)."""

    def __init__(self, problem: Problem, nodes: Sequence[int] | None = None) -> None:
        """nodes: restrict to the sub-graph induced by these node indices (default: all)."""
        self.problem = problem
        members = range(problem.n) if nodes is None else sorted(nodes)
        inside = set(members)
        self.nodes: list[int] = list(members)
        self.anc: dict[int, int] = {}
        self.des: dict[int, int] = {}
        # node indices follow the capture order, which is topological
        for v in self.nodes:
            acc = 0
            for p in problem.preds[v]:
                if p in inside:
                    acc |= self.anc[p] | (1 << p)
            self.anc[v] = acc
        for v in reversed(self.nodes):
            acc = 0
            for s in problem.succs[v]:
                if s in inside:
                    acc |= self.des[s] | (1 << s)
            self.des[v] = acc

    def narrow_waist(self) -> dict[int, int]:
        """nw(v) = |V| - |anc(v)| - |des(v)| - 1: how many nodes are independent of v (MAGIS §6.1)."""
        total = len(self.nodes)
        return {v: total - self.anc[v].bit_count() - self.des[v].bit_count() - 1 for v in self.nodes}

    def comparable(self, a: int, b: int) -> bool:
        return a == b or bool(self.anc[b] >> a & 1) or bool(self.des[b] >> a & 1)


def members(mask: int) -> list[int]:
    """The node indices in a bitset, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def _bits(mask: int, n: int) -> np.ndarray:
    raw = np.frombuffer(mask.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)


def forced_memory(problem: Problem, reach: Reachability | None = None) -> np.ndarray:
    """Bytes live while each node runs in EVERY topological order (per node index).

    A storage is forced live at v when its allocating node is v or an ancestor
    of v and some node touching it is v or a descendant of v (or it is a
    program output). max(forced) is a lower bound on the peak of any order.
    """
    reach = reach or Reachability(problem)
    n = problem.n
    forced = np.zeros(n, dtype=np.int64)
    for k, touch in enumerate(problem.touches):
        a = touch[0]  # the creator: every other toucher depends on it
        down = reach.des[a] | (1 << a)
        if problem.to_end[k]:
            mask = down
        else:
            up = 0
            for t in touch:
                up |= reach.anc[t] | (1 << t)
            mask = down & up
        forced[_bits(mask, n)] += problem.size[k]
    return forced + problem.workspace + problem.baseline


def lower_bound(problem: Problem, reach: Reachability | None = None) -> int:
    """A peak no topological order can go below (bytes)."""
    if problem.n == 0:
        return problem.baseline
    return int(forced_memory(problem, reach).max())
