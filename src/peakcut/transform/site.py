"""Where a rewrite of the base graph applies: the one site type of every rewrite rule
(peakcut.rules.base.RewriteRule)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RewriteSite:
    """One applicable rewrite.

    kind: its rule's kind; nodes: the nodes the rule is applied to (the matmuls to merge, the
    blocks to checkpoint, the one node of an algebraic rule, ...); description: what the
    rewrite does, in words; params: the numbers the rule reads when it applies, where it needs
    any (split_matmul: the output features of each part, none to un-merge; split_rows: the
    number of parts).
    """

    kind: str
    nodes: tuple[int, ...]
    description: str
    params: tuple[int, ...] = ()
