"""Repeated blocks of a step (a transformer's layers, ResNet's bottlenecks, U-Net++'s
nodes): the forward nodes of each, found by module path, and how their lists are named."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.tags import RematTag

_NUMBER = re.compile(r"\d+")


@dataclass(frozen=True)
class Block:
    """One repeated module's forward nodes, in capture order."""

    module: str                # e.g. "model.layers.3", "layer2.1", "nodes.x1_0"
    nodes: tuple[int, ...]
    recompute_handed: bool = False   # also recompute, for the backward, the tensors the block
    # hands to later forward nodes (an attention's scores, read by the value matmul): its
    # output is not kept for the backward then, only for the forward


def find_blocks(g: Graph) -> dict[str, list[Block]]:
    """The step's repeated blocks, by list name ('model.layers' -> its blocks in order).

    A block is a module whose forward runs ops of at least two module paths (a layer, not a
    single convolution), one of at least two such modules whose paths differ only in their
    numbers: `model.layers.3`, ResNet's bottlenecks `layer2.1` (across stages), U-Net++'s
    `nodes.x1_0`. Where such families nest (a stage `layer2` holds bottlenecks; a layer holds
    its `mlp`), the family with more members wins, the outer one on a tie. A list is named
    by its pattern without a trailing number (`model.layers`, `layer#`, `nodes.x#_#`).
    """
    under: dict[str, list[int]] = {}       # module path -> the forward nodes under it
    paths: dict[str, set[str]] = {}         # module path -> the module paths of those nodes
    for nid in g.order:
        node = g.nodes[nid]
        if node.phase is not Phase.FORWARD or node.tags.get(RematTag) is not None or not node.module:
            continue
        parts = node.module.split(".")
        for k in range(1, len(parts) + 1):
            prefix = ".".join(parts[:k])
            under.setdefault(prefix, []).append(nid)
            paths.setdefault(prefix, set()).add(node.module)
    families: dict[str, list[str]] = {}
    for prefix in under:                   # in the order of their first forward node
        if len(paths[prefix]) >= 2 and _NUMBER.search(prefix):
            families.setdefault(_NUMBER.sub("#", prefix), []).append(prefix)
    chosen: list[str] = []
    for pattern in sorted((p for p, ms in families.items() if len(ms) >= 2),
                          key=lambda p: (-len(families[p]), p.count("."))):
        if not any(pattern.startswith(c + ".") or c.startswith(pattern + ".") for c in chosen):
            chosen.append(pattern)
    return {p.removesuffix(".#"): [Block(m, tuple(under[m])) for m in families[p]]
            for p in sorted(chosen, key=lambda p: min(under[m][0] for m in families[p]))}


def blocks_of(g: Graph, nodes: Sequence[int]) -> list[Block] | str:
    """`nodes` (forward nodes of blocks find_blocks finds) grouped by block, in order; a reason
    where one is not such a node in g."""
    module = {v: b.module for blocks in find_blocks(g).values() for b in blocks for v in b.nodes}
    grouped: dict[str, list[int]] = {}
    for v in nodes:
        if v not in module:
            return f"node {v} is not a forward node of a repeated block in this graph"
        grouped.setdefault(module[v], []).append(v)
    return [Block(key, tuple(vs)) for key, vs in grouped.items()]


def list_name(module: str) -> str:
    """The name of the list block `module` belongs to ('model.layers.3' -> 'model.layers',
    'layer2.1' -> 'layer#'), as find_blocks names it."""
    return _NUMBER.sub("#", module).removesuffix(".#")
