"""The host_update rule in the registry: a parameter's optimizer update runs on the host
(ZeRO-Offload's way), on its optimizer state kept in host memory, with its gradient copied out
once made (the rule itself, and what it refuses: peakcut.transform.host_update).

Sites: the parameters whose update still runs on the device, most device bytes freed at the
peak first (state on the device, and the gradient or update copies live there); those that
free nothing there last (their state offloaded already: the rule then saves its copies).
Stores, the update's ops and the upload are placed EARLY: the host stream takes the updates in
the order their gradients come (the last layer's first). The code is codegen's
(codegen/host_update_code.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.tags import HostTag
from peakcut.rules.base import ProgramRule, Site
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.query import Query
from peakcut.schedule.placement import Placement
from peakcut.transform.host_update import (
    Facts,
    UpdatePlan,
    plan_update,
    update_on_host,
    update_sites,
    why_not_update_on_host,
)
from peakcut.transform.rewrite import Rewrite, RuleError, check_order_matches, describe_tensor


class HostUpdateRule(ProgramRule):
    """Run a parameter's optimizer update on the host (module docstring)."""

    kind = "host_update"
    frees_by_host_copy = True
    batched = True

    def sites(self, query: Query) -> Iterable[HotspotSite]:
        profile = query.hotspot.profile
        peak = profile.peak_index
        live = {s for s, (alloc, free) in profile.storage_lifetime.items() if alloc <= peak <= free}
        found = [HotspotSite(t, seeds[0], seeds, freed, freed) for t, seeds, freed in update_sites(query.g, peak, live)]
        found.sort(key=lambda s: (-s.score, s.tensor))
        return found

    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        return why_not_update_on_host(g, order, site.tensor)

    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        stale = check_order_matches(g, order)
        plan = stale or plan_update(g, site.tensor)
        if isinstance(plan, str):
            raise RuleError(plan)
        return update_on_host(g, order, [plan], self.describe(Query(g, order), site))

    def apply_many(self, g: Graph, order: Sequence[int], sites: Sequence[Site]
                   ) -> tuple[Rewrite | None, list[str | None]]:
        """The sites where the rule applies on (g, order), rewritten in one edit: each
        parameter's update is its own (they read and write disjoint tensors), so judging every
        site on g is judging it after the others. Returns the rewrite (None when no site
        applies) and, per site, why it does not apply (None: applied)."""
        stale = check_order_matches(g, order)
        if stale:
            return None, [stale] * len(sites)
        facts = Facts(g)
        plans: list[UpdatePlan] = []
        reasons: list[str | None] = []
        seen: set[int] = set()
        for site in sites:
            plan = plan_update(g, site.tensor, facts) if site.tensor not in seen else "the same parameter twice"
            reasons.append(plan if isinstance(plan, str) else None)
            if not isinstance(plan, str):
                plans.append(plan)
                seen.add(site.tensor)
        if not plans:
            return None, reasons
        what = (self.describe(Query(g, order), sites[reasons.index(None)]) if len(plans) == 1
                else f"update {len(plans)} parameters on the host")
        return update_on_host(g, order, plans, what), reasons

    def describe(self, query: Query, site: Site) -> str:
        g = query.g
        where = ("kept in host memory" if g.is_host_storage(g.tensors[site.tensor].storage)
                 else "its new value copied back to the device")
        return (f"update {describe_tensor(g, site.tensor)} on the host: its optimizer state in host "
                f"memory, its gradient copied out once made, the parameter {where}")

    def placements(self, g: Graph) -> Iterable[tuple[int, Placement]]:
        # all EARLY: a store right after what it copies, the update's ops right after their
        # gradient's store, the upload right after the update
        return [(nid, Placement.EARLY) for nid, n in g.nodes.items() if n.tags.get(HostTag) is not None]
