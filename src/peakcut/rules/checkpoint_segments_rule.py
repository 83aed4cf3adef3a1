"""checkpoint_segments: the forward ops outside the repeated blocks recomputed for their
backward, as checkpoint_blocks does for the blocks (peakcut.transform.checkpoint_segments).
It offers sites once some block is checkpointed (the blocks hold most of the activations),
and the search tries three rewrite sites per expanded state instead of two
(MoveSettings.taso_per_state). With two, its sites take a slot from recompute_activations (at
the root) or uncheckpoint_blocks (once the blocks are checkpointed), and on the paper-size
workloads (bench.optimize, simulated) BERT-base at 40% of eager's memory goes from +6.3% to
+27.7% latency on RTX 3090 (sites at the root) and ResNet-50 from +7.4% to +14.0% (sites
after the blocks); with three they keep their figures.
Its sites, in this order:
- every block joined with the segment that makes its input (a U-Net++ node with the
  concatenation before it; at medium size 754 -> 571 MiB against every node checkpointed
  alone, simulated);
- every forward segment between, before and after the blocks, alone (a ResNet's stem; at
  medium size, with every bottleneck checkpointed, 556 -> 495 MiB);
- the first half of the joined blocks.
Undone by uncheckpoint_blocks, like a block (the recomputes carry the unit's name).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.ir.tags import RematTag
from peakcut.rules.checkpoint_rule import BlockRule
from peakcut.rules.query import Query
from peakcut.transform.checkpoint import Block, checkpoint_blocks, why_not_checkpoint
from peakcut.transform.checkpoint_segments import group_units, joins_a_segment, units_between_blocks
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.site import RewriteSite


class CheckpointSegmentsRule(BlockRule):
    """The ops between the blocks, alone or with the block they feed, recomputed for the
    backward (torch.utils.checkpoint around each of those spans)."""

    kind = "checkpoint_segments"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g, order = query.g, query.order
        if not _a_block_checkpointed(g):
            return
        all_segments, all_joined = units_between_blocks(g)
        joined = [b for b in all_joined if why_not_checkpoint(g, order, b) is None]
        if any(map(joins_a_segment, joined)):
            yield _site(joined, f"checkpoint {len(joined)} blocks, each with the ops that make its input")
        segments = [b for b in all_segments if why_not_checkpoint(g, order, b) is None]
        if segments:
            yield _site(segments, f"checkpoint the {len(segments)} forward segment(s) between the blocks")
        if len(joined) >= 4 and any(map(joins_a_segment, joined[:len(joined) // 2])):
            half = joined[:len(joined) // 2]
            yield _site(half, f"checkpoint the first {len(half)} blocks, each with the ops that make its input")

    def targets(self, g: Graph, site: RewriteSite) -> list[Any] | str:
        return group_units(g, site.nodes)

    def why_not_one(self, g: Graph, order: Sequence[int], target: Any) -> str | None:
        return why_not_checkpoint(g, order, target)

    def apply_all(self, g: Graph, order: Sequence[int], targets: list[Any]) -> tuple[Rewrite | None, list[str | None]]:
        return checkpoint_blocks(g, order, targets)


def _a_block_checkpointed(g: Graph) -> bool:
    """Whether some repeated block's forward is recomputed already (module doc: the glue
    comes after the layers)."""
    return any((tag := n.tags.get(RematTag)) is not None and tag.block for n in g.nodes.values())


def _site(units: Sequence[Block], what: str) -> RewriteSite:
    return RewriteSite("checkpoint_segments", tuple(v for b in units for v in b.nodes), what)
