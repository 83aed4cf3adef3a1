"""The offload_param rule in the registry: a parameter lives in host memory between steps and
comes to the device once for each phase that uses it (forward and loss, backward, update), a
fresh copy each time, freed after that phase's last use (the rule itself:
peakcut.transform.offload_param).

Sites: the parameters still on the device that no phase copy would hold at the memory peak,
largest first; score = bytes x the distance from the peak to the nearest phase's window. A
load goes as late as its copy can be hidden, a writeback right after the update's last write,
a view made again from a phase's copy right before its readers; the code is codegen's
(codegen/input_copy_code.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP
from peakcut.rules.base import ProgramRule, Site, apply_in_one_edit
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.query import Query
from peakcut.schedule.placement import Placement
from peakcut.transform.offload_param import (
    offload_param_nodes,
    offload_params,
    param_windows,
    remade_views,
    why_not_offload_param,
)
from peakcut.transform.rewrite import Rewrite, RuleError, describe_tensor


class OffloadParamRule(ProgramRule):
    """Keep a parameter in host memory, on the device per phase that uses it (module doc)."""

    kind = "offload_param"
    frees_by_host_copy = True
    batched = True

    def sites(self, query: Query) -> Iterable[HotspotSite]:
        spot = query.hotspot
        g = spot.g
        found = []
        for t, first, readers, gap in param_windows(g, spot.order, spot.profile.peak_index):
            size = g.storages[g.tensors[t].storage]
            found.append(HotspotSite(t, first, readers, size, size * gap))
        found.sort(key=lambda s: (-s.score, s.tensor))
        return found

    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        return why_not_offload_param(g, order, site.tensor)

    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        reason = self.why_not(g, order, site)
        if reason:
            raise RuleError(reason)
        return offload_params(g, order, [site.tensor], self.describe(Query(g, order), site))

    def apply_many(self, g: Graph, order: Sequence[int], sites: Sequence[Site]
                   ) -> tuple[Rewrite | None, list[str | None]]:
        """The parameters of `sites` where the rule applies, kept in host memory in one edit
        (each parameter's copies and views touch its own storage only)."""
        return apply_in_one_edit(self, g, order, sites, offload_params,
                                 "keep {n} parameters in host memory, on the device per phase that uses them")

    def describe(self, query: Query, site: Site) -> str:
        return f"keep {describe_tensor(query.g, site.tensor)} in host memory, on the device per phase that uses it"

    def placements(self, g: Graph) -> Iterable[tuple[int, Placement]]:
        mine = offload_param_nodes(g)
        out = [(nid, Placement.HIDDEN if n.op == LOAD_OP else Placement.EARLY) for nid, n in mine.items()]
        out.extend((nid, Placement.LATE) for nid in remade_views(g, mine))
        return out
