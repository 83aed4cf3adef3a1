"""The code of recomputes (nodes tagged NodeTags.remat): an ordinary ATen call under a
`# recompute of <name>` comment."""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.codegen.hooks import CodeHook, Names, NodeCode
from peakcut.ir.graph import Graph
from peakcut.ir.tags import RematTag


class RecomputeHook(CodeHook):
    """Recomputes: a comment line before each (RecomputeComments)."""

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        if not any(n.tags.get(RematTag) is not None for n in g.nodes.values()):
            return None
        return RecomputeComments(g, order)


class RecomputeComments(NodeCode):
    """A `# recompute of <name>` line before every recompute (the call itself is ordinary); once
    for a run of nodes that recompute the same node (a batch norm's normalize)."""

    def __init__(self, g: Graph, order: Sequence[int]) -> None:
        self.g = g
        self.continued: set[int] = set()    # recomputes right after one of the same node
        previous = None
        for nid in order:
            tag = g.nodes[nid].tags.get(RematTag)
            if tag is not None and previous is not None and tag.of == previous:
                self.continued.add(nid)
            previous = tag.of if tag is not None else None

    def before(self, nid: int, pad: str) -> list[str]:
        tag = self.g.nodes[nid].tags.get(RematTag)
        if tag is None or nid in self.continued:
            return []
        original = tag.of
        if original in self.g.nodes:
            return [f"{pad}# recompute of {self.g.nodes[original].name or original}"]
        return [f"{pad}# recompute of node {original}"]
