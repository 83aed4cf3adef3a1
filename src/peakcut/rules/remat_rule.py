"""The remat rule in the registry: later readers of a tensor read a recomputed copy of the
node that made it (the rule itself: peakcut.transform.remat). Tried at the storages idle
across the memory peak; a recompute is placed right before its first reader, and the
generated code marks it with a `# recompute of <node>` comment (codegen/recompute_code.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.tags import RematTag
from peakcut.rules.base import ProgramRule, Site
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.query import Query
from peakcut.schedule.placement import Placement
from peakcut.transform.remat import remat, why_not_remat
from peakcut.transform.rewrite import Rewrite, describe_node


class RematRule(ProgramRule):
    """Re-materialization (MAGIS §5.2, Fig. 8a-d) as a program rule."""

    kind = "remat"

    def sites(self, query: Query) -> Iterable[HotspotSite]:
        """The idle storages, less those read through an identity view (a detach): on the
        CNNs those are ReLU outputs, whose recompute keeps the batch norm's output (as large)
        alive instead. Offered to remat, they took the search's moves from the swaps that
        free them: ResNet-50 at <= 10% on RTX 3090, 56.2% of eager against 39.9% (simulated)."""
        return [s for s in query.hotspot.idle() if not s.through_views]

    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        return why_not_remat(g, order, site.node, site.users)

    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        return remat(g, order, site.node, site.users)

    def describe(self, query: Query, site: Site) -> str:
        return f"remat {describe_node(query.g, site.node)} for {len(site.users)} reader(s)"

    def placements(self, g: Graph) -> Iterable[tuple[int, Placement]]:
        late = Placement.LATE
        return [(nid, late) for nid, node in g.nodes.items() if node.tags.get(RematTag) is not None]
