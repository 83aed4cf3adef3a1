"""Checkpointing a model's repeated blocks, and undoing it, as rewrites of the base graph (the
rewrites themselves: peakcut.transform.checkpoint). checkpoint_blocks' sites: per list of
repeated blocks (a transformer's layers, a ResNet's bottlenecks), every block, and the first half
of them (half the recompute; in a CNN the first blocks run at the highest resolution and hold
the most activations: ResNet-50 at paper size, first half 53% of eager's peak at +15% latency,
every second block 73% at +13%). uncheckpoint_blocks' sites: the last half of the checkpointed
blocks of a list, then all of them: where memory allows, the search trades recompute back for latency (a rewrite has no
undo move of its own).

They are the rewrites that may touch enabled fission regions (phase REGIONS): the copies
become base nodes, the F-Tree is found again on the new base and the enabled regions carried
over, so a region that micro-batches the whole step recomputes each block per part (what
the program rules, which stay outside regions, cannot do)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.tags import RematTag
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import REGIONS, SEARCH
from peakcut.rules.query import Query
from peakcut.transform.checkpoint import (
    Block,
    blocks_of,
    checkpoint_blocks,
    checkpointed_blocks,
    find_blocks,
    uncheckpoint_blocks,
    why_not_checkpoint,
    why_not_uncheckpoint,
)
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.site import RewriteSite


class BlockRule(RewriteRule):
    """What the block rules do alike: a site names blocks; it applies where one of them does."""

    phases = frozenset({SEARCH, REGIONS})

    @abstractmethod
    def targets(self, g: Graph, site: RewriteSite) -> list[Any] | str:
        """The blocks the site names in g, or why it names none."""

    @abstractmethod
    def why_not_one(self, g: Graph, order: Sequence[int], target: Any) -> str | None:
        """Why the rule does not apply to one target; None when it does."""

    @abstractmethod
    def apply_all(self, g: Graph, order: Sequence[int], targets: list[Any]) -> tuple[Rewrite | None, list[str | None]]:
        """The rule applied to every target it applies to (None: to none), and per target why
        it does not apply (None: applied)."""

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        targets = self.targets(g, site)
        if isinstance(targets, str):
            return targets
        reasons = [self.why_not_one(g, order, t) for t in targets]
        return None if None in reasons else reasons[0]

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        targets = self.targets(g, site)
        if isinstance(targets, str):
            raise RuleError(targets)
        done, reasons = self.apply_all(g, order, targets)
        if done is None:
            raise RuleError(next(r for r in reasons if r))
        return done

    def describe(self, query: Query, site: RewriteSite) -> str:
        return site.description


class CheckpointBlocksRule(BlockRule):
    """Each block's backward reads a recompute of the block's forward (torch.utils.checkpoint
    around every block, or around the first half)."""

    kind = "checkpoint_blocks"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g, order = query.g, query.order
        for name, blocks in find_blocks(g).items():
            ready = [b for b in blocks if why_not_checkpoint(g, order, b) is None]
            if not ready:
                continue
            yield _site(ready, f"checkpoint {len(ready)} blocks of {name}")
            if len(ready) >= 4:
                half = ready[:len(ready) // 2]
                yield _site(half, f"checkpoint the first {len(half)} blocks of {name}")

    def targets(self, g: Graph, site: RewriteSite) -> list[Any] | str:
        return _blocks(g, site)

    def why_not_one(self, g: Graph, order: Sequence[int], target: Any) -> str | None:
        return why_not_checkpoint(g, order, target)

    def apply_all(self, g: Graph, order: Sequence[int], targets: list[Any]) -> tuple[Rewrite | None, list[str | None]]:
        return checkpoint_blocks(g, order, targets)


class UncheckpointBlocksRule(BlockRule):
    """Checkpointed blocks' backward reads the forward's tensors again (checkpoint_blocks undone)."""

    kind = "uncheckpoint_blocks"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g = query.g
        for name, modules in checkpointed_blocks(g).items():
            if len(modules) >= 2:
                half = modules[len(modules) // 2:]
                yield _undo_site(g, half, f"un-checkpoint the last {len(half)} checkpointed blocks of {name}")
            yield _undo_site(g, modules, f"un-checkpoint {len(modules)} blocks of {name}")

    def targets(self, g: Graph, site: RewriteSite) -> list[Any] | str:
        return _modules(g, site)

    def why_not_one(self, g: Graph, order: Sequence[int], target: Any) -> str | None:
        return why_not_uncheckpoint(g, order, target)

    def apply_all(self, g: Graph, order: Sequence[int], targets: list[Any]) -> tuple[Rewrite | None, list[str | None]]:
        return uncheckpoint_blocks(g, order, targets)


def _undo_site(g: Graph, modules: Sequence[str], what: str) -> RewriteSite:
    """A site naming the recomputes of `modules` (one node each stands for its block)."""
    wanted = set(modules)
    firsts: dict[str, int] = {}
    for v in g.order:
        tag = g.nodes[v].tags.get(RematTag)
        if tag is not None and tag.block in wanted and tag.block not in firsts:
            firsts[tag.block] = v
    return RewriteSite("uncheckpoint_blocks", tuple(firsts[m] for m in modules), what)


def _modules(g: Graph, site: RewriteSite) -> list[str] | str:
    """The checkpointed blocks a site of uncheckpoint_blocks names."""
    out = []
    for v in site.nodes:
        node = g.nodes.get(v)
        tag = node.tags.get(RematTag) if node is not None else None
        if tag is None or not tag.block:
            return f"node {v} of the site is not a block's recompute in this graph"
        out.append(tag.block)
    return out


def _site(blocks: Sequence[Block], what: str) -> RewriteSite:
    return RewriteSite("checkpoint_blocks", tuple(v for b in blocks for v in b.nodes), what)


def _blocks(g: Graph, site: RewriteSite) -> list[Block] | str:
    """The site's blocks in g: its nodes grouped by block, in order."""
    return blocks_of(g, site.nodes)
