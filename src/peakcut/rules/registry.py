"""The rule registry: every rule the search uses, listed once (RULES, at the bottom), and the
loops over it that the search and the scheduler's placement share.

- hotspot_candidates: where each program rule applies at the memory hot-spot;
- rewrite_candidates: the rewrite rules' sites, interleaved;
- placements: where the nodes program rules added go (schedule.place);
- move_kinds: the search's move kinds, in the order it tries them.

A new rule is its own file (a subclass of a base class of peakcut.rules.base) plus one line
in RULES (docs/rules.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from peakcut.ir.graph import Graph
from peakcut.memory import MemoryProfile, simulate
from peakcut.rules.activations_rule import RecomputeActivationsRule
from peakcut.rules.attention_rule import RecomputeAttentionRule
from peakcut.rules.base import REWRITE_MOVES, ProgramRule, RegionRule, RewriteRule
from peakcut.rules.batch_norm_rule import SplitBatchNormsRule
from peakcut.rules.checkpoint_rule import CheckpointBlocksRule, UncheckpointBlocksRule
from peakcut.rules.checkpoint_segments_rule import CheckpointSegmentsRule
from peakcut.rules.chunked_loss_rule import ChunkedLossRule
from peakcut.rules.conv_cat_rule import SplitConvCatRule
from peakcut.rules.conv_grads_rule import SplitConvGradsRule
from peakcut.rules.fission_rule import FissionRule
from peakcut.rules.fused_attention_rule import FusedAttentionRule
from peakcut.rules.generated_rule import GeneratedRule
from peakcut.rules.host_update_rule import HostUpdateRule
from peakcut.rules.offload_param_rule import OffloadParamRule
from peakcut.rules.offload_state_rule import OffloadStateRule
from peakcut.rules.phase import in_search
from peakcut.rules.query import Query
from peakcut.rules.regather_rule import RegatherRule
from peakcut.rules.remat_rule import RematRule
from peakcut.rules.spatial_rule import SplitRowsRule
from peakcut.rules.swap_rule import SwapRule
from peakcut.rules.taso_rules import (
    CancelTransposesRule,
    DropIdentityRule,
    FoldViewsRule,
    MergeMatmulsRule,
    SplitMatmulRule,
)
from peakcut.rules.vertex_ranges_rule import SplitVertexRangesRule
from peakcut.schedule.placement import Placement
from peakcut.transform.rewrite import Rewrite, check_candidate_query
from peakcut.transform.site import RewriteSite

UNDO_MOVES = "undo"   # the search's move kind of dropping a recipe (de-remat, de-swap, ...)


@dataclass(frozen=True)
class Candidate:
    """A site at the hot-spot where a program rule applies.

    rule: the rule (kind: its kind); tensor, node, users: the site (a ProgramRule's Site);
    bytes: bytes of the tensor's storage; score: the site's score (hotspot module doc).
    """

    rule: ProgramRule
    tensor: int
    node: int
    users: tuple[int, ...]
    bytes: int
    score: int

    @property
    def kind(self) -> str:
        return self.rule.kind

    def apply(self, g: Graph, order: Sequence[int]) -> Rewrite:
        """Apply this candidate's rule to (g, order), the graph and order it was found on."""
        return self.rule.apply(g, order, self)


@dataclass(frozen=True)
class Registry:
    """The rules, by family (peakcut.rules.base), each family in the order the search
    tries its moves: regions, then program rules, then rewrites (then undos). Kinds are
    unique across families."""

    regions: tuple[RegionRule, ...]
    programs: tuple[ProgramRule, ...]
    rewrites: tuple[RewriteRule, ...]
    _program: Mapping[str, ProgramRule] = field(init=False, repr=False, compare=False)
    _rewrite: Mapping[str, RewriteRule] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        kinds = [*(r.kind for r in self.regions), *(r.kind for r in self.programs),
                 *(r.kind for r in self.rewrites)]
        twice = sorted({k for k in kinds if kinds.count(k) > 1})
        if twice:
            raise ValueError(f"rule kinds must be unique; {twice} registered twice")
        reserved = sorted({REWRITE_MOVES, UNDO_MOVES}.intersection(kinds))
        if reserved:
            raise ValueError(f"rule kinds {reserved} are the search's own move kinds")
        object.__setattr__(self, "_program", MappingProxyType({r.kind: r for r in self.programs}))
        object.__setattr__(self, "_rewrite", MappingProxyType({r.kind: r for r in self.rewrites}))

    # ------------------------------------------------------------------ lookup
    @property
    def program_kinds(self) -> tuple[str, ...]:
        return tuple(self._program)

    @property
    def rewrite_kinds(self) -> tuple[str, ...]:
        return tuple(self._rewrite)

    @property
    def move_kinds(self) -> tuple[str, ...]:
        """The kinds of the search's moves a MoveSettings can switch, in the order the search
        tries them: each region rule, each program rule, then REWRITE_MOVES (every rewrite)."""
        rewrites = (REWRITE_MOVES,) if self.rewrites else ()
        return (*(r.kind for r in self.regions), *self.program_kinds, *rewrites)

    def program_rule(self, kind: str) -> ProgramRule:
        """The program rule of this kind (KeyError names the known ones)."""
        found = self._program.get(kind)
        if found is None:
            raise KeyError(f"no program rule {kind!r}; known: {self.program_kinds}")
        return found

    def rewrite_rule(self, kind: str) -> RewriteRule:
        """The rewrite rule of this kind (KeyError names the known ones)."""
        found = self._rewrite.get(kind)
        if found is None:
            raise KeyError(f"no rewrite rule {kind!r}; known: {self.rewrite_kinds}")
        return found

    def apply_rewrite(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        """The rewrite rule of site.kind applied at `site` of (g, order) (RuleError or ValueError
        where it does not apply)."""
        return self.rewrite_rule(site.kind).apply(g, order, site)

    # ------------------------------------------------------------------ finding candidates
    def hotspot_candidates(self, g: Graph, order: Sequence[int], profile: MemoryProfile | None = None,
                           limit: int = 16, kinds: Sequence[str] | None = None) -> list[Candidate]:
        """Where the program rules of `kinds` (default all) apply at the peak of `order`, best
        score first (then kind, then tensor).

        profile: simulate(g, order) (computed when None; it must be of this order; its peak may
        be moved to look elsewhere). At most `limit` candidates of each kind: each rule's sites
        are tried in order until `limit` of them apply.
        """
        kinds = self.program_kinds if kinds is None else kinds
        check_candidate_query(g, order, kinds, self.program_kinds, limit, "candidate")
        if profile is None:
            profile = simulate(g, list(order))
        elif tuple(profile.order) != tuple(order):
            raise ValueError("profile was simulated for another order; pass simulate(g, order)")
        query = Query(g, order, profile=profile)
        out: list[Candidate] = []
        for kind in dict.fromkeys(kinds):
            rule = self._program[kind]
            found = 0
            for site in rule.sites(query) if limit else ():
                if rule.why_not(g, order, site) is None:
                    out.append(Candidate(rule, site.tensor, site.node, site.users, site.bytes, site.score))
                    found += 1
                    if found >= limit:
                        break
        out.sort(key=lambda c: (-c.score, c.kind, c.tensor))
        return out

    def rewrite_candidates(self, g: Graph, order: Sequence[int], limit: int = 32,
                           kinds: Sequence[str] | None = None) -> list[RewriteSite]:
        """Sites of the rewrite rules of `kinds` (default: those of a phase during the search,
        peakcut.rules.phase) on (g, order): at most `limit`,
        the kinds interleaved in the order of `kinds` (the first site of each kind, then the
        second of each, ...) so that a limit keeps some of every kind; each kind's sites in its
        rule's order. Sites are validated lazily: only as many as the limit keeps (the same
        list as validating all). Deterministic for a given graph."""
        kinds = [r.kind for r in self.rewrites if in_search(r)] if kinds is None else kinds
        check_candidate_query(g, order, kinds, self.rewrite_kinds, limit, "TASO candidate")
        query = Query(g, order)
        live = [self._rewrite[k].sites(query) for k in dict.fromkeys(kinds)]
        out: list[RewriteSite] = []
        while live and len(out) < limit:   # one round: the next site of each kind left
            still: list[Iterator[RewriteSite]] = []
            for sites in live:
                if len(out) >= limit:
                    break
                found = next(sites, None)
                if found is not None:
                    out.append(found)
                    still.append(sites)
            live = still
        return out

    # ------------------------------------------------------------------ placement
    def placements(self, g: Graph) -> dict[int, Placement]:
        """Node -> where it goes (schedule.place), for every node a program rule added to g."""
        out: dict[int, Placement] = {}
        for rule in self.programs:
            out.update(rule.placements(g))
        return out


RULES = Registry(
    regions=(
        FissionRule(),
    ),
    programs=(
        SwapRule(),
        RematRule(),
        RegatherRule(),
        OffloadStateRule(),
        OffloadParamRule(),
        HostUpdateRule(),
    ),
    rewrites=(
        SplitConvCatRule(),      # first: it drops copies at a small cost (transform/taso/conv_cat.py)
        GeneratedRule(),         # the generated substitutions that shrink a graph (docs/taso.md)
        SplitVertexRangesRule(), # sums over a graph's edges in edge ranges (docs/gnn.md): early, so that
                                 # each expanded state of a GNN step tries it (taso_per_state)
        CheckpointBlocksRule(),
        RecomputeActivationsRule(),
        RecomputeAttentionRule(),
        CheckpointSegmentsRule(),
        UncheckpointBlocksRule(),
        MergeMatmulsRule(),
        SplitMatmulRule(),
        DropIdentityRule(),
        CancelTransposesRule(),
        FoldViewsRule(),
        SplitRowsRule(),
        SplitBatchNormsRule(),   # it saves transients only and costs latency (docs/fission.md)
        SplitConvGradsRule(),    # last: mostly at the plan's peak after the search (optimizer/polish.py)
    ),
)
"""Every rule the search uses, in the order it tries them (see Registry)."""

WITH_FUSED = Registry(regions=RULES.regions, programs=RULES.programs,
                      rewrites=(*RULES.rewrites[:2], FusedAttentionRule(), ChunkedLossRule(), *RULES.rewrites[2:]))
"""RULES and the fused substitutions, fused attention (rules/fused_attention_rule.py) and the
head and loss in chunks of the sequence (rules/chunked_loss_rule.py), tried right after the
generated substitutions: opt-in, as peakcut.optimize(..., rules=WITH_FUSED) or
Deriver(rules=WITH_FUSED)."""
