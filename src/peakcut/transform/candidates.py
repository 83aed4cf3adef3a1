"""Where to try swap and remat: tensors live across the memory hot-spot (MAGIS §5.2 heuristic).

At the simulated peak step t* (MemoryProfile.peak_index) a storage is a candidate when it is
live at t* but untouched by the node at t*, allocated before t*, read again after t*, and all
its reads after t* go through one tensor x produced before t* (or through views the readers
make of x, which follow x into the copy). The readers of x after t* are the rule's users:
once they read a swapped-in or recomputed copy, the storage is free from its last access
before t* to its next access after t*.

Score (the reference code's, notes §4, weighted by size): storage bytes × min(t* - last access
before t*, next access after t* - t*): long idle gaps on both sides of the peak leave room to
hide a swap's copies or to recompute far from the original.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.memory import MemoryProfile, simulate
from peakcut.transform.remat import remat, why_not_remat
from peakcut.transform.rewrite import Rewrite, check_candidate_query, program_output_storages
from peakcut.transform.swap import swap, why_not_swap

KINDS = ("swap", "remat")


@dataclass(frozen=True)
class Candidate:
    """One applicable rule application at the hot-spot.

    kind: 'swap' or 'remat'; tensor: the tensor live across the peak; node: its producer (the
    node recomputed for remat); users: its readers after the peak, in order; bytes: bytes of
    its storage; score: bytes × idle steps around the peak (see the module docstring).
    """

    kind: str
    tensor: int
    node: int
    users: tuple[int, ...]
    bytes: int
    score: int

    def apply(self, g: Graph, order: Sequence[int]) -> Rewrite:
        """Apply this candidate's rule to (g, order), the graph and order it was found on."""
        if self.kind == "swap":
            return swap(g, order, self.tensor, self.users)
        return remat(g, order, self.node, self.users)


@dataclass(frozen=True)
class _Idle:
    tensor: int
    node: int
    users: tuple[int, ...]
    bytes: int
    score: int


def _idle_storages(g: Graph, order: Sequence[int], profile: MemoryProfile) -> list[_Idle]:
    """Storages idle across the peak whose later reads all go through one tensor, best first."""
    peak = profile.peak_index
    skip = g.caller_held_storages() | g.host_storages() | program_output_storages(g)
    accesses: dict[int, list[int]] = {}
    reads_after: dict[int, dict[int, list[int]]] = {}
    made_after: set[int] = set()
    nodes = g.nodes
    tensors = g.tensors
    for i, nid in enumerate(order):
        node = nodes[nid]
        for t in (*node.input_tuple, *node.output_tuple):
            s = tensors[t].storage
            seen = accesses.setdefault(s, [])
            if not seen or seen[-1] != i:
                seen.append(i)
        if i > peak:
            made_after.update(node.output_tuple)
            for t in node.input_tuple:
                readers = reads_after.setdefault(tensors[t].storage, {}).setdefault(t, [])
                if not readers or readers[-1] != nid:
                    readers.append(nid)
    found: list[_Idle] = []
    for s, (alloc, free) in profile.storage_lifetime.items():
        if s in skip or not alloc < peak < free or peak in accesses.get(s, ()):
            continue
        roots = [t for t in reads_after.get(s, {}) if t not in made_after]
        if len(roots) != 1:
            continue  # not read after the peak, or read through several tensors
        x = roots[0]
        producer = g.producer(x)
        if producer is None:
            continue
        before = max(p for p in accesses[s] if p < peak)
        after = min(p for p in accesses[s] if p > peak)
        size = g.storages[s]
        found.append(_Idle(x, producer, tuple(reads_after[s][x]), size,
                           size * min(peak - before, after - peak)))
    found.sort(key=lambda c: (-c.score, c.tensor))
    return found


def hotspot_candidates(
    g: Graph,
    order: Sequence[int],
    profile: MemoryProfile | None = None,
    limit: int = 16,
    kinds: Sequence[str] = KINDS,
) -> list[Candidate]:
    """Applicable swap and remat candidates at the peak of `order`, best score first.

    profile: simulate(g, order) (computed when None; it must be of this order). At most
    `limit` candidates of each kind; only candidates whose rule applies are returned.
    """
    check_candidate_query(g, order, kinds, KINDS, limit, "candidate")
    if profile is None:
        profile = simulate(g, list(order))
    elif tuple(profile.order) != tuple(order):
        raise ValueError("profile was simulated for another order; pass simulate(g, order)")
    counts = dict.fromkeys(kinds, 0)
    out: list[Candidate] = []
    for idle in _idle_storages(g, order, profile):
        if all(n >= limit for n in counts.values()):
            break
        for kind in kinds:
            if counts[kind] >= limit:
                continue
            if kind == "swap":
                reason = why_not_swap(g, order, idle.tensor, idle.users)
            else:
                reason = why_not_remat(g, order, idle.node, idle.users)
            if reason is None:
                counts[kind] += 1
                out.append(Candidate(kind, idle.tensor, idle.node, idle.users, idle.bytes,
                                     idle.score))
    out.sort(key=lambda c: (-c.score, c.kind, c.tensor))
    return out
