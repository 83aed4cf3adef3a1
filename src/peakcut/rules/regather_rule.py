"""The regather rule in the registry: the readers of an FSDP2 parameter after the memory peak
read a second all-gather of its shard, so the full parameter gathered for the forward is
freed before the peak (FSDP2's reshard after forward, per parameter; the body:
peakcut.transform.regather). Tried at the gathered parameters alive across the peak, largest
first; all of them at once is one move too (the rule is batched), as FSDP2 reshards every
unit. The gather is placed hidden, its wait and views right before their first reader."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from peakcut.ir.collectives import ALL_GATHER_OP
from peakcut.ir.graph import Graph
from peakcut.ir.registry import OpKind, lookup
from peakcut.rules.base import ProgramRule, Site
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.query import Query
from peakcut.schedule.placement import Placement
from peakcut.transform.regather import RegatherTag, regather, regather_many, why_not_regather
from peakcut.transform.rewrite import Rewrite, describe_node


def _reads_data(g: Graph, nid: int) -> bool:
    info = lookup(g.nodes[nid].op)
    return not (info is not None and info.kind is OpKind.VIEW) and not g.nodes[nid].op.startswith("peakcut.wait")


class RegatherRule(ProgramRule):
    """Gather an FSDP2 parameter again for the readers after the peak."""

    kind = "regather"
    batched = True

    def sites(self, query: Query) -> Iterable[HotspotSite]:
        hotspot = query.hotspot
        g, order, profile = hotspot.g, hotspot.order, hotspot.profile
        peak = profile.peak_index
        found: list[HotspotSite] = []
        gathers = [(i, nid) for i, nid in enumerate(order) if g.nodes[nid].op == ALL_GATHER_OP]
        if not gathers:
            return found
        storage_of = {g.tensors[g.nodes[nid].outputs[0]].storage: nid for _, nid in gathers  # type: ignore[index]
                      if g.nodes[nid].outputs[0] is not None}
        accesses: dict[int, list[int]] = {s: [] for s in storage_of}
        for i, nid in enumerate(order):
            if not _reads_data(g, nid):
                continue
            for t in g.nodes[nid].input_tuple:
                s = g.tensors[t].storage
                if s in accesses:
                    accesses[s].append(i)
        for s, gather in storage_of.items():
            alloc, free = profile.storage_lifetime.get(s, (peak, peak))
            reads = accesses[s]
            if not (alloc < peak < free) or peak in reads or not any(r < peak for r in reads):
                continue
            users = tuple(order[r] for r in sorted(set(reads)) if r > peak)
            if users:
                size = g.storages[s]
                found.append(HotspotSite(g.nodes[gather].outputs[0], gather, users, size, size))  # type: ignore[arg-type]
        return sorted(found, key=lambda site: -site.score)

    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        return why_not_regather(g, order, site.node, site.users)

    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        return regather(g, order, site.node, site.users)

    def apply_many(self, g: Graph, order: Sequence[int], sites: Sequence[Site]
                   ) -> tuple[Rewrite | None, list[str | None]]:
        """Every site in one edit (each gather is its own parameter's)."""
        return regather_many(g, order, [(site.node, site.users) for site in sites])

    def describe(self, query: Query, site: Site) -> str:
        return f"gather {describe_node(query.g, site.node)} again for {len(site.users)} reader(s) after the peak"

    def placements(self, g: Graph) -> Iterable[tuple[int, Placement]]:
        for nid, node in g.nodes.items():
            if node.tags.get(RegatherTag) is not None:
                yield nid, Placement.HIDDEN if node.op == ALL_GATHER_OP else Placement.LATE
