"""Rewrites made on the search's root before the search, where they dominate it.

    root = with_root_rewrites(root, deriver)

A rewrite rule with `on_root` (peakcut.rules.protocol.RewriteRule) has its first site applied
to the root; the rewritten state replaces the root where its simulated peak is lower and its
simulated latency not higher (a Pareto improvement on the step the search starts from, so no
limit it could have met becomes unreachable). Why: the search tries a few rewrite sites per
expanded state among many swaps and recomputes, and with 36 expansions in 60 s on paper-size
U-Net (RTX 3090, <= 10% latency) the plan it kept swapped the decoder's concatenations out
(three of them, PCIe time) instead of never making them (split_conv_cat: 8% lower at 0.3%
less time, simulated). The move is listed in the plan's `applied` like any other.
"""

from __future__ import annotations

from peakcut.optimizer.children import MoveSettings
from peakcut.optimizer.derive import DeriveError, Deriver
from peakcut.optimizer.state import State
from peakcut.rules import REWRITE_MOVES
from peakcut.transform.rewrite import RuleError


def with_root_rewrites(root: State, deriver: Deriver, settings: MoveSettings | None = None) -> State:
    """`root` with every on_root rule's first site applied where that dominates (module doc);
    none where `settings` leave the rewrite moves out."""
    if settings is not None and not settings.uses(REWRITE_MOVES):
        return root
    for rule in deriver.rules.rewrites:
        if not getattr(rule, "on_root", False):   # a rule written to the protocol without subclassing it
            continue
        site = next(iter(rule.sites(root.base, root.base_order)), None)
        if site is None:
            continue
        try:
            child = deriver.resolve(deriver.with_taso(root, site))
        except (DeriveError, RuleError, ValueError):
            continue
        if child.peak_bytes < root.peak_bytes and child.latency_s <= root.latency_s:
            root = child
    return root
