"""The memory hot-spot of a program: where remat and swap are tried (MAGIS §5.2 heuristic H2).

At the simulated peak step t* (MemoryProfile.peak_index) a storage is idle across the peak
when it is live at t* but untouched by the node at t*, allocated before t*, read again after
t*, and all its reads after t* go through one tensor x produced before t* (directly, through
identity views of x made before t*, such as the forward's detach of a saved activation, or
through views the readers make of x, which follow x into the copy). The readers of x after t* are the
rule's users: once they read a swapped-in or recomputed copy, the storage is free from its
last access before t* to its next access after t*.

Score (the MAGIS reference code's, weighted by size): storage bytes × min(t* - last access
before t*, next access after t* - t*): long idle gaps on both sides of the peak leave room to
hide a swap's copies or to recompute far from the original.

A Hotspot is what a program rule's `sites` hook reads (Query.hotspot, peakcut.rules.query): the program,
its order and memory profile, and the idle storages, found once however many rules ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.memory import MemoryProfile
from peakcut.transform.rewrite import identity_views, positions, program_output_storages


@dataclass(frozen=True)
class HotspotSite:
    """Where a program rule may apply at the hot-spot: `tensor` (for an idle storage, its one
    root read after the peak, or the root its other roots are identity views of), `node` (the
    tensor's producer), `users` (its readers after the peak, in order, those of its identity
    views included), `bytes` of its storage and a `score` (higher: tried first; see the module
    docstring)."""

    tensor: int
    node: int
    users: tuple[int, ...]
    bytes: int
    score: int
    through_views: bool = False    # some users read identity views of `tensor` (a detach)


class Hotspot:
    """A program, its order and memory profile (the peak may be moved: MemoryProfile.peak_index),
    with the storages idle across the peak computed at the first `idle()`."""

    def __init__(self, g: Graph, order: Sequence[int], profile: MemoryProfile) -> None:
        self.g = g
        self.order = order
        self.profile = profile
        self._idle: list[HotspotSite] | None = None

    def idle(self) -> list[HotspotSite]:
        """Storages idle across the peak whose later reads all go through one tensor (or its
        identity views), best first."""
        if self._idle is None:
            self._idle = idle_storages(self.g, self.order, self.profile)
        return self._idle


def idle_storages(g: Graph, order: Sequence[int], profile: MemoryProfile) -> list[HotspotSite]:
    """Storages idle across the peak whose later reads all go through one tensor (or its
    identity views), best first."""
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
    found: list[HotspotSite] = []
    pos: dict[int, int] | None = None
    for s, (alloc, free) in profile.storage_lifetime.items():
        if s in skip or not alloc < peak < free or peak in accesses.get(s, ()):
            continue
        roots = [t for t in reads_after.get(s, {}) if t not in made_after]
        x = _one_root(g, roots)
        if x is None:
            continue  # not read after the peak, or read through several tensors
        producer = g.producer(x)
        if producer is None:
            continue
        before = max(p for p in accesses[s] if p < peak)
        after = min(p for p in accesses[s] if p > peak)
        size = g.storages[s]
        if len(roots) > 1:
            pos = positions(order) if pos is None else pos
            users = tuple(sorted({u for t in roots for u in reads_after[s][t]}, key=pos.__getitem__))
        else:
            users = tuple(reads_after[s][x])
        found.append(HotspotSite(x, producer, users, size, size * min(peak - before, after - peak),
                                 len(roots) > 1))
    found.sort(key=lambda c: (-c.score, c.tensor))
    return found


def _one_root(g: Graph, roots: Sequence[int]) -> int | None:
    """The tensor a storage's reads after the peak go through: its one root, or the root the
    others are identity views of (the forward's detach of an activation saved for the
    backward: ResNet's ReLU outputs are read by the next convolution's backward and, through
    a detach, by their own threshold_backward); None when there is none."""
    if len(roots) == 1:
        return roots[0]
    for x in roots:
        views = set(identity_views(g, x))
        if all(t == x or t in views for t in roots):
            return x
    return None
