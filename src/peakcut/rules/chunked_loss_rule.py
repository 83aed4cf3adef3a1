"""chunked_loss: a language model's head and loss (the vocabulary projection, log-softmax,
cross-entropy and their backward) run in chunks of the sequence
(peakcut.transform.chunked_loss): the batch x sequence x vocabulary logits and their gradient
are never whole. One site per loss, its number of chunks the least that keeps one chunk's
float32 logits within CHUNK_BYTES; a move of the search (SEARCH), kept where the objective
prefers it. Opt-in: in registry.WITH_FUSED, not in RULES."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import SEARCH
from peakcut.rules.query import Query
from peakcut.transform.chunked_loss import chunk_head_loss, find_chunkable, why_not_chunk
from peakcut.transform.head_loss import HeadLoss, find_head_loss
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.site import RewriteSite

CHUNK_BYTES = 384 * 2 ** 20   # one chunk's logits in float32 at most (GPT-Neo-1.3B at paper size: 8 chunks)


def chunks_for(g: Graph, h: HeadLoss) -> int:
    """The least number of chunks whose float32 logits fit CHUNK_BYTES (2 at least, one
    position per chunk at most)."""
    positions = h.end - h.start
    vocab = g.tensors[h.wt].shape[-1]
    whole = h.batch * positions * vocab * 4
    return max(2, min(positions, math.ceil(whole / CHUNK_BYTES)))


class ChunkedLossRule(RewriteRule):
    """The head and loss in chunks of the sequence (module doc)."""

    kind = "chunked_loss"
    # a move of the search only, not on its root: with fused attention on BTLM-3B at paper size the
    # rewritten root's hot-spot leaves the F-Tree no whole-step regions (docs/taso.md)
    phases = frozenset({SEARCH})

    def describe(self, query: Query, site: RewriteSite) -> str:
        return f"chunked: {site.description}"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        for h in find_chunkable(query.g):
            chunks = chunks_for(query.g, h)
            yield RewriteSite(self.kind, (h.loss,), f"the head and loss in {chunks} chunks of the sequence",
                              (chunks,))

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        if len(site.nodes) != 1 or len(site.params) != 1:
            return "the site names no loss and number of chunks"
        (loss,), (chunks,) = site.nodes, site.params
        if loss not in g.nodes:
            return f"node {loss} is not in the graph"
        h = find_head_loss(g, loss)
        return h if isinstance(h, str) else why_not_chunk(g, h, chunks)

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        return chunk_head_loss(g, order, site.nodes[0], site.params[0], label=self.kind)
