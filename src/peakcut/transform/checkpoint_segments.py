"""The forward ops outside a model's repeated blocks, as units to checkpoint like blocks.

find_blocks (transform/checkpoint/blocks.py) finds the repeated modules; what runs between them is
left whole: a ResNet's stem (conv1, bn1, relu, maxpool: at medium size 67 MiB of activations
held through the whole backward once every bottleneck is checkpointed), a U-Net's input
double convolution and the upsampling and concatenation before each decoder stage, U-Net++'s
concatenations (a cat copies tensors that are kept anyway; at medium size 308 of the 552 MiB
live at the checkpointed step's peak). Two ways to recompute them, each a list of `Block`s
that checkpoint_blocks takes as it takes repeated blocks (its safety checks and placement
apply unchanged):

- forward_segments: each maximal run of forward ops, in capture order, that belongs to no
  repeated block (a stem, a head, the ops between two stages). What a segment hands to later
  forward ops (its output: a block's input) is kept; what only its own backward reads is
  recomputed there.
- blocks_with_inputs: each repeated block joined with the segment right before it (the ops
  that make its input). The block's input is then made inside the unit, so it is recomputed
  too, from what the segment reads (for a concatenation: the tensors it concatenates).

Names (Block.module, the recomputes' RematTag.block) are unique in the graph: a segment is
named by its first and last module and node ("conv1..maxpool (convolution..max_pool2d_with_
indices)"), a joined block "<block> with <segment>". group_units recovers the units from the
flat node tuple of a rule's site.
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.tags import RematTag
from peakcut.transform.checkpoint import Block, find_blocks

JOIN = " with "     # between a joined unit's block and its segment in the unit's name


def _repeated(g: Graph) -> dict[int, str]:
    """Forward node -> the repeated block it is in."""
    return {v: b.module for blocks in find_blocks(g).values() for b in blocks for v in b.nodes}


def _walk(g: Graph, in_block: dict[int, str]) -> tuple[list[list[int]], dict[str, tuple[list[int], list[int]]]]:
    """One walk over the forward nodes (recomputes left out) in capture order: the maximal runs
    in no repeated block, and per block (in order) the run right before it and its own nodes.
    Both empty when the step has no repeated blocks (then nothing lies between them)."""
    runs: list[list[int]] = []
    units: dict[str, tuple[list[int], list[int]]] = {}
    if not in_block:
        return runs, units
    current: list[int] = []       # the forward nodes outside blocks since the last block node
    for v in g.order:
        node = g.nodes[v]
        if node.phase is not Phase.FORWARD or node.tags.get(RematTag) is not None:
            continue
        module = in_block.get(v)
        if module is None:
            current.append(v)
            continue
        if current:
            runs.append(current)
        if module not in units:
            units[module] = (current, [])
        units[module][1].append(v)
        current = []
    if current:
        runs.append(current)
    return runs, units


def _segment_name(g: Graph, run: Sequence[int]) -> str:
    """"<first module>..<last module> (<first node>..<last node>)": unique, node names are."""
    def name(node_id: int) -> str:
        return g.nodes[node_id].name or f"node {node_id}"

    modules = [g.nodes[v].module for v in run if g.nodes[v].module]
    where = f"{modules[0]}..{modules[-1]}" if modules else "step"
    nodes = name(run[0]) if len(run) == 1 else f"{name(run[0])}..{name(run[-1])}"
    return f"{where} ({nodes})"


def _unit(g: Graph, module: str | None, before: Sequence[int], nodes: Sequence[int]) -> Block:
    """The Block of block `module` (None: none) with the segment nodes `before` it."""
    if module is None:
        return Block(_segment_name(g, before), tuple(nodes))
    return Block(f"{module}{JOIN}{_segment_name(g, before)}" if before else module, tuple(nodes))


def joins_a_segment(unit: Block) -> bool:
    """Whether a unit of blocks_with_inputs holds a segment besides its block (module paths
    have no spaces, so JOIN is in no block's own name)."""
    return JOIN in unit.module


def units_between_blocks(g: Graph) -> tuple[list[Block], list[Block]]:
    """(forward_segments(g), blocks_with_inputs(g)), from one walk of the graph."""
    runs, units = _walk(g, _repeated(g))
    return ([Block(_segment_name(g, run), tuple(run)) for run in runs],
            [_unit(g, module, before, (*before, *nodes)) for module, (before, nodes) in units.items()])


def forward_segments(g: Graph) -> list[Block]:
    """The forward ops between, before and after the repeated blocks, one Block per maximal
    run (module doc), in capture order."""
    return units_between_blocks(g)[0]


def blocks_with_inputs(g: Graph) -> list[Block]:
    """Every repeated block joined with the segment that runs right before it (module doc), in
    capture order; a block with no segment right before it (the next bottleneck of a stage)
    is itself."""
    return units_between_blocks(g)[1]


def group_units(g: Graph, nodes: Sequence[int]) -> list[Block] | str:
    """The units (of forward_segments or blocks_with_inputs) whose nodes, unit after unit,
    are `nodes`: a unit starts at a segment's node unless a node of the same segment comes
    right before, and at a block's node unless the node before is of the same block or of
    a segment (the segment joined to it). A reason where a node is no forward node of g."""
    in_block = _repeated(g)
    segment_of = {v: i for i, run in enumerate(_walk(g, in_block)[0]) for v in run}
    groups: list[list[int]] = []
    previous: int | None = None
    for v in nodes:
        if v not in in_block and v not in segment_of:
            return f"node {v} is not a forward node of this graph (or a recompute)"
        if v in segment_of:
            new = previous is None or segment_of.get(previous) != segment_of[v]
        else:
            new = previous is None or (previous in in_block and in_block[previous] != in_block[v])
        if new:
            groups.append([])
        groups[-1].append(v)
        previous = v
    return [_unit(g, next((in_block[v] for v in group if v in in_block), None),
                  [v for v in group if v in segment_of], group) for group in groups]
