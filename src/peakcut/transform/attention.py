"""Attention's scores recomputed for the backward (what torchtitan's selective checkpointing and
a memory-efficient attention kernel both avoid holding): a written-out attention keeps its
softmax output, batch x heads x sequence x sequence, for the backward of the softmax and of the
matmul with the values, and often a cast of it too (GPT-Neo's fp32 softmax cast back to bf16).
Those are the largest activations of a transformer's step (BERT-base at batch 32 and sequence
512: 4.5 of 20.6 GiB; GPT-Neo-1.3B: 18 of 80 GiB), while what makes them is one batched
matmul of tensors the backward keeps anyway (the query and key) and a few element-wise
passes (scale, mask, softmax).

A unit is one softmax's scores: the forward chain from the matmul that makes the scores to
the softmax (its element-wise and view ops: the scale, the mask's `where` and `add`, a cast),
and the forward views and one-input element-wise ops after the softmax (a cast, the expand and
view the value matmul reads). The units are recomputed for the backward by checkpoint_blocks
(transform/checkpoint: its safety checks, placement and tags), one per softmax, so the
backward reads a recompute placed right before its first reader, and the forward frees the
scores as soon as the value matmul has run. A softmax whose chain reaches no matmul within
CHAIN_DEPTH ops is left alone (remat and recompute_activations cover element-wise chains).
"""

from __future__ import annotations

from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.registry import OpKind, lookup
from peakcut.ir.tags import RematTag
from peakcut.transform.checkpoint import Block

SOFTMAX_OPS: frozenset[str] = frozenset({"aten._softmax.default", "aten._safe_softmax.default"})
CHAIN_DEPTH = 8
SCORES = " scores"      # a unit's name: the softmax's module and this suffix


def _kind(g: Graph, v: int) -> OpKind | None:
    info = lookup(g.nodes[v].op)
    return info.kind if info is not None else None


def _forward(g: Graph, v: int | None) -> bool:
    return v is not None and g.nodes[v].phase is Phase.FORWARD and g.nodes[v].tags.get(RematTag) is None


def _chain_to_matmul(g: Graph, softmax: int) -> list[int] | None:
    """The forward nodes from the matmul that makes the softmax's input to the node before the
    softmax, first to last; None when no matmul is reached through element-wise and view ops."""
    chain: list[int] = []
    node = softmax
    for _ in range(CHAIN_DEPTH):
        out_numel = g.tensors[g.nodes[node].output_ids()[0]].numel
        inputs = [t for t in g.nodes[node].input_ids()
                  if _forward(g, g.producer(t)) and g.tensors[t].numel == out_numel]
        if not inputs:
            return None
        producer = g.producer(inputs[0])
        if producer is None:
            return None
        kind = _kind(g, producer)
        chain.append(producer)
        if kind is OpKind.MATMUL:
            return chain[::-1]
        if kind not in (OpKind.ELEMENTWISE, OpKind.VIEW) or len(g.nodes[producer].output_ids()) != 1:
            return None
        node = producer
    return None


def _after(g: Graph, softmax: int) -> list[int]:
    """Forward views and one-input element-wise ops of the softmax's output (transitively): a
    cast, the expand and view the value matmul reads, the detach the backward reads."""
    found: list[int] = []
    frontier = list(g.nodes[softmax].output_ids())
    while frontier:
        t = frontier.pop()
        for u in g.users(t):
            if u in found or not _forward(g, u):
                continue
            kind = _kind(g, u)
            one_input = len(g.nodes[u].input_ids()) == 1
            if (kind is OpKind.VIEW or (kind is OpKind.ELEMENTWISE and one_input)) and len(g.nodes[u].output_ids()) == 1:
                found.append(u)
                frontier.extend(g.nodes[u].output_ids())
    return found


def _read_after_forward(g: Graph, nodes: list[int]) -> bool:
    return any(g.nodes[u].phase is not Phase.FORWARD
               for v in nodes for t in g.nodes[v].output_ids() for u in g.users(t))


def attention_units(g: Graph) -> list[Block]:
    """One unit per forward softmax whose scores the backward reads and whose chain starts at a
    matmul, in forward order (module doc)."""
    units: list[Block] = []
    pos = {v: i for i, v in enumerate(g.order)}
    for v in g.order:
        node = g.nodes[v]
        if node.op not in SOFTMAX_OPS or not _forward(g, v):
            continue
        chain = _chain_to_matmul(g, v)
        if chain is None:
            continue
        after = _after(g, v)
        if not _read_after_forward(g, [v, *after]):
            continue
        nodes = sorted({*chain, v, *after}, key=pos.__getitem__)
        units.append(Block(f"{node.module or node.name or v}{SCORES}", tuple(nodes), recompute_handed=True))
    return units
