"""The swap rule in the registry: a tensor is copied to host memory right after it is made and
copied back before some later readers (the rule itself: peakcut.transform.swap). Tried at the
storages idle across the memory peak; the store runs right after the producer, the load as
late as its transfer can still be hidden; the code is peakcut.codegen.swap_code's."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.node import Node
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.tags import SwapTag
from peakcut.rules.base import ProgramRule, Site
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.query import Query
from peakcut.schedule.placement import Placement
from peakcut.transform.rewrite import Rewrite, describe_tensor
from peakcut.transform.swap import swap, why_not_swap


def is_swap_store(node: Node) -> bool:
    """A swap's store (an update on the host's stores are that rule's: NodeTags.host)."""
    return node.op == STORE_OP and node.tags.get(SwapTag) is not None


def has_swaps(g: Graph) -> bool:
    """True when g holds a swap (a store; its loads come with it)."""
    return any(is_swap_store(n) for n in g.nodes.values())


class SwapRule(ProgramRule):
    """Swapping (MAGIS §5.2, Fig. 8e-f) as a program rule."""

    kind = "swap"
    frees_by_host_copy = True

    def sites(self, query: Query) -> Iterable[HotspotSite]:
        return query.hotspot.idle()

    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        return why_not_swap(g, order, site.tensor, site.users)

    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        return swap(g, order, site.tensor, site.users)

    def describe(self, query: Query, site: Site) -> str:
        return f"swap {describe_tensor(query.g, site.tensor)} out, back in for {len(site.users)} reader(s)"

    def placements(self, g: Graph) -> Iterable[tuple[int, Placement]]:
        early, hidden = Placement.EARLY, Placement.HIDDEN
        return [(nid, early if node.op == STORE_OP else hidden) for nid, node in g.nodes.items()
                if is_swap_store(node) or (node.op == LOAD_OP and not g.is_input_copy(node))]
