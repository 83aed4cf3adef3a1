"""The offload_state rule in the registry: an optimizer-state tensor (an Adam moment, a momentum
buffer) lives in host memory between steps and comes to the device only for its own update
(the rule itself: peakcut.transform.offload_state).

Sites: the optimizer-state inputs still on the device whose update window (load to last write)
lies away from the memory peak, largest first; score = bytes x the distance from the peak to
the window. The load goes as late as its copy can be hidden, the writeback right after the
last write; the code is codegen's (codegen/input_copy_code.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP
from peakcut.rules.base import ProgramRule, Site, apply_in_one_edit
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.query import Query
from peakcut.schedule.placement import Placement
from peakcut.transform.offload_state import (
    offload_state,
    offload_state_nodes,
    state_windows,
    why_not_offload_state,
)
from peakcut.transform.rewrite import Rewrite, RuleError, describe_tensor


class OffloadStateRule(ProgramRule):
    """Keep an optimizer-state tensor in host memory between steps (module docstring)."""

    kind = "offload_state"
    frees_by_host_copy = True
    batched = True

    def sites(self, query: Query) -> Iterable[HotspotSite]:
        spot = query.hotspot
        g = spot.g
        found = []
        for t, readers, gap in state_windows(g, spot.order, spot.profile.peak_index):
            size = g.storages[g.tensors[t].storage]
            found.append(HotspotSite(t, readers[0], readers, size, size * gap))
        found.sort(key=lambda s: (-s.score, s.tensor))
        return found

    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        return why_not_offload_state(g, order, site.tensor)

    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        reason = self.why_not(g, order, site)
        if reason:
            raise RuleError(reason)
        return offload_state(g, order, [site.tensor], self.describe(Query(g, order), site))

    def apply_many(self, g: Graph, order: Sequence[int], sites: Sequence[Site]
                   ) -> tuple[Rewrite | None, list[str | None]]:
        """The state inputs of `sites` where the rule applies, kept in host memory in one edit
        (each input's load and writeback touch its own storage only)."""
        return apply_in_one_edit(self, g, order, sites, offload_state,
                                 "keep {n} optimizer-state tensors in host memory")

    def describe(self, query: Query, site: Site) -> str:
        return f"keep {describe_tensor(query.g, site.tensor)} in host memory, on the device for its update only"

    def placements(self, g: Graph) -> Iterable[tuple[int, Placement]]:
        return [(nid, Placement.HIDDEN if n.op == LOAD_OP else Placement.EARLY)
                for nid, n in offload_state_nodes(g).items()]
