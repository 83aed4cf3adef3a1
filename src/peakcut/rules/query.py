"""What a rule reads to find and describe its sites (the argument of every family's `sites` and
`describe`, peakcut.rules.base).

A Query holds a program (graph and order) and what else its caller has:
- program rules: the memory profile, from which the hot-spot (peakcut.rules.hotspot) is found
  once however many rules ask;
- region rules: the state's F-Tree, and whether a root may be enabled directly;
- rewrite rules: the phase that asks (peakcut.rules.phase) and, after the search, the node
  where the plan peaks.
A rule that needs what its caller did not give raises ValueError.
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.fission.ftree import FTree
from peakcut.ir.graph import Graph
from peakcut.memory import MemoryProfile
from peakcut.rules.hotspot import Hotspot
from peakcut.rules.phase import SEARCH, Phase


class Query:
    """A program (g, order) and what its caller knows of it (module doc)."""

    __slots__ = ("_profile", "_spot", "_tree", "direct_enable", "g", "order", "peak", "phase")

    def __init__(self, g: Graph, order: Sequence[int], *, profile: MemoryProfile | None = None,
                 tree: FTree | None = None, direct_enable: bool = True, phase: Phase = SEARCH,
                 peak: int | None = None) -> None:
        self.g = g
        self.order = order
        self._profile = profile
        self._spot: Hotspot | None = None
        self._tree = tree
        self.direct_enable = direct_enable
        """Region rules: a root whose descendants are all disabled may be enabled directly."""
        self.phase = phase
        """Rewrite rules: the phase that asks for sites."""
        self.peak = peak
        """Rewrite rules, after the search: the node where the plan peaks (None: not asked there)."""

    @property
    def hotspot(self) -> Hotspot:
        """The memory hot-spot of the program (program rules' sites)."""
        if self._spot is None:
            if self._profile is None:
                raise ValueError("this query has no memory profile: pass profile= for program rules")
            self._spot = Hotspot(self.g, self.order, self._profile)
        return self._spot

    @property
    def tree(self) -> FTree:
        """The state's F-Tree (region rules)."""
        if self._tree is None:
            raise ValueError("this query has no F-Tree: pass tree= for region rules")
        return self._tree
