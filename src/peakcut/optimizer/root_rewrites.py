"""Rewrites made on the search's root before the search, where they dominate it: every phase
that runs before the search (peakcut.rules.phase; the built-in one is ROOT).

    root = with_root_rewrites(root, deriver)

Phase by phase, in the order the registry's rules declare them, each rewrite rule of the phase
has its first site (RewriteRule.sites, Query.phase the phase) applied to the root; the
rewritten state replaces the root where its simulated peak is lower and its
simulated latency not higher (a Pareto improvement on the step the search starts from, so no
limit it could have met becomes unreachable), and also where the objective prefers it at a
latency at most ROOT_LATENCY_SLACK above the root's: a latency limit the root meets, the
rewritten root meets too (the objective says so), and under a memory limit the root misses, a
lower peak is what the search needs first. Paper U-Net++ (RTX 3090, simulated): split_conv_cat
takes the root from 7.83 to 5.59 GiB for +0.55% latency; without the slack the root kept its
concatenations, and at 40% of eager's memory the 60 s search never found the rewrite among its
sites (best plan 43%, limit not met). Why: the search tries a few rewrite sites per
expanded state among many swaps and recomputes, and with 36 expansions in 60 s on paper-size
U-Net (RTX 3090, <= 10% latency) the plan it kept swapped the decoder's concatenations out
(three of them, PCIe time) instead of never making them (split_conv_cat: 8% lower at 0.3%
less time, simulated). The move is listed in the plan's `applied` like any other.

Then each batched program rule that asks for it (ProgramRule.at_root) is tried at every one
of its sites at once, kept where it dominates or wherever the objective prefers it (the
search has a move that undoes all of a batched rule's recipes): regather, FSDP2's reshard
after forward. On Llama-2-7B's FSDP2 step (8 x H100, simulated) it takes the root from 29.4
to 17.5 GiB for +1.4% latency (the backward's gathers); a 20 s search of that 13,000-op
step expands one state, so a move it would take first is made before the search starts.
"""

from __future__ import annotations

import math

from peakcut.optimizer.children import MoveSettings, root_bulk_moves
from peakcut.optimizer.derive import DeriveError, Deriver
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.state import State
from peakcut.rules import REWRITE_MOVES
from peakcut.rules.phase import Phase, declared
from peakcut.rules.query import Query
from peakcut.transform.rewrite import RuleError

ROOT_LATENCY_SLACK = 0.01    # of the root's simulated latency, where the objective prefers the rewrite
AT_ROOT_LATENCY_SLACK = math.inf  # ... for a batched rule's move at every site (ProgramRule.at_root): the search may undo it


def with_root_rewrites(root: State, deriver: Deriver, settings: MoveSettings | None = None,
                       objective: Objective | None = None) -> State:
    """`root` with the first site of every rule of a phase before the search applied where
    that dominates, or where `objective` prefers it within ROOT_LATENCY_SLACK (module doc),
    none where `settings` leave the rewrite moves out; then each batched program rule that
    asks for it (ProgramRule.at_root) at every one of its sites, kept alike."""
    if settings is None or settings.uses(REWRITE_MOVES):
        for phase in declared(deriver.rules.rewrites, "before"):
            root = _phase(phase, root, deriver, objective)
    for move in root_bulk_moves(root, deriver, settings or MoveSettings()):
        try:
            child = move.build()
        except (DeriveError, RuleError, ValueError):
            continue
        if _takes(child, root, objective, AT_ROOT_LATENCY_SLACK):
            root = child
    return root


def _phase(phase: Phase, root: State, deriver: Deriver, objective: Objective | None) -> State:
    """`root` after the rules of one phase before the search (module doc)."""
    for rule in deriver.rules.rewrites:
        if phase not in rule.phases:
            continue
        site = next(iter(rule.sites(Query(root.base, root.base_order, phase=phase))), None)
        if site is None:
            continue
        try:
            child = deriver.resolve(deriver.with_taso(root, site))
        except (DeriveError, RuleError, ValueError):
            continue
        if _takes(child, root, objective):
            root = child
    return root


def _takes(child: State, root: State, objective: Objective | None, slack: float = ROOT_LATENCY_SLACK) -> bool:
    """Whether the rewritten root replaces the root (module doc)."""
    if child.peak_bytes < root.peak_bytes and child.latency_s <= root.latency_s:
        return True
    return (objective is not None and child.latency_s <= root.latency_s * (1 + slack)
            and objective.better(objective.key(child.peak_bytes, child.latency_s),
                                 objective.key(root.peak_bytes, root.latency_s)))
