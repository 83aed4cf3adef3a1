"""The regather rule in the registry: the backward's readers of an FSDP2 parameter read a
second all-gather of its shard, so the full parameter gathered for the forward is freed after
the forward's last read (FSDP2's reshard after forward, per parameter; the body:
peakcut.transform.regather). Tried at the gathered parameters alive across the memory peak,
largest first; all of them at once is one move too (the rule is batched), as FSDP2 reshards
every unit, and that move is tried on the search's root (`at_root`). The readers are found
when the rule applies, so a recipe replayed after checkpoint_blocks also serves the
recomputes the checkpoint added to the backward. The gather is placed hidden, its wait and
views right before their first reader."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from peakcut.ir.collectives import ALL_GATHER_OP
from peakcut.ir.graph import Graph
from peakcut.rules.base import ProgramRule, Site
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.query import Query
from peakcut.schedule.placement import Placement
from peakcut.transform.regather import (
    RegatherTag,
    backward_readers,
    regather,
    regather_many,
    why_not_regather,
)
from peakcut.transform.rewrite import Rewrite, describe_node


def _users(g: Graph, site: Site) -> tuple[int, ...]:
    """The site's readers in `g` as it is now: the backward's (module doc)."""
    return backward_readers(g, site.node)


class RegatherRule(ProgramRule):
    """Gather an FSDP2 parameter again for its readers in the backward."""

    kind = "regather"
    batched = True
    at_root = True

    def sites(self, query: Query) -> Iterable[HotspotSite]:
        hotspot = query.hotspot
        g, order, profile = hotspot.g, hotspot.order, hotspot.profile
        peak = profile.peak_index
        found: list[HotspotSite] = []
        for nid in order:
            node = g.nodes[nid]
            if node.op != ALL_GATHER_OP or node.outputs[0] is None:
                continue
            s = g.tensors[node.outputs[0]].storage
            alloc, free = profile.storage_lifetime.get(s, (peak, peak))
            if not alloc < peak < free:
                continue
            users = backward_readers(g, nid)
            if users:
                found.append(HotspotSite(node.outputs[0], nid, users, g.storages[s], g.storages[s]))
        return sorted(found, key=lambda site: -site.score)

    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        return why_not_regather(g, order, site.node, _users(g, site))

    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        return regather(g, order, site.node, _users(g, site))

    def apply_many(self, g: Graph, order: Sequence[int], sites: Sequence[Site]
                   ) -> tuple[Rewrite | None, list[str | None]]:
        """Every site in one edit (each gather is its own parameter's)."""
        return regather_many(g, order, [(site.node, _users(g, site)) for site in sites])

    def describe(self, query: Query, site: Site) -> str:
        return f"gather {describe_node(query.g, site.node)} again for its {len(site.users)} reader(s) in the backward"

    def placements(self, g: Graph) -> Iterable[tuple[int, Placement]]:
        for nid, node in g.nodes.items():
            if node.tags.get(RegatherTag) is not None:
                yield nid, Placement.HIDDEN if node.op == ALL_GATHER_OP else Placement.LATE
