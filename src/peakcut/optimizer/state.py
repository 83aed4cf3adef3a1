"""The search state (MAGIS §3 M-State): graph, F-Tree, schedule and simulation result.

A State keeps
- base: the step graph fission regions refer to (loss-detached capture, after any
  TASO-style rewrites), with its order, F-Tree and D-Graph;
- recipes: the remat/swap applications made on top of the fissioned program, in the
  ids of nodes outside every enabled region (rules never cross a region's boundary),
  so that they can be replayed when the F-Tree changes;
- program/order: what runs (the base with its enabled regions expanded into their
  parts, then the recipes applied), and its simulated peak and latency; in a compact
  state (`compact`), part 0 of each region only, priced per part (optimizer.compact),
  which Deriver.exact turns into the program that runs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from peakcut.fission.dgraph import DGraph
from peakcut.fission.ftree import FTree
from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef


@dataclass(frozen=True)
class Recipe:
    """One remat or swap application: the tensor (swap) or node (remat) and its users."""

    kind: str                  # "remat" | "swap"
    tensor: int
    node: int
    users: tuple[int, ...]
    description: str


@dataclass
class State:
    base: Graph
    base_order: list[int]
    tree: FTree
    dgraph: DGraph                            # the base's D-Graph (what the tree's regions split)
    recipes: tuple[Recipe, ...]
    program: Graph
    order: list[int]
    peak_bytes: int
    latency_s: float
    applied: tuple[str, ...]                  # what was done, oldest first (for the report)
    digest: str                               # computation hash of the program
    depth: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    compact: bool = False                     # program is a compact expansion (Deriver.exact)

    def fission(self) -> tuple[tuple[int, int], ...]:
        """(F-Tree node, n) of every enabled node."""
        return tuple((f.id, f.n) for f in self.tree.enabled())


def computation_hash(g: Graph, order: list[int] | None = None) -> str:
    """A hash of what the graph computes: equal hashes mean the same ops on the same values.

    Tensors are named by how they are computed (Merkle style: the producer's op, its
    arguments' hashes, scalars and the output index; program inputs by their name), and
    the graph by the sorted multiset of node hashes. Node ids, order, names and modules
    do not enter; control edges do (they order in-place writes). Part copies of a
    fissioned region differ in their slice arguments, so fission numbers are visible.
    """
    order = list(g.order if order is None else order)
    tensor_hash: dict[int, str] = {t: f"in:{name}" for t, name in zip(g.inputs, g.input_names, strict=True)}
    node_hash: dict[int, str] = {}

    def arg(value: Any) -> Any:
        if isinstance(value, TensorRef):
            return tensor_hash.get(value.id, f"?{value.id}")
        if isinstance(value, (list, tuple)):
            return tuple(arg(v) for v in value)
        if isinstance(value, dict):
            return tuple(sorted((k, arg(v)) for k, v in value.items()))
        return repr(value)

    for nid in order:
        node = g.nodes[nid]
        key = repr((node.op, arg(node.args), arg(node.kwargs),
                    tuple(sorted(node_hash.get(c, "?") for c in g.control.get(nid, ())))))
        h = hashlib.blake2b(key.encode(), digest_size=16).hexdigest()
        node_hash[nid] = h
        for i, t in enumerate(node.outputs):
            if t is not None:
                tensor_hash[t] = f"{h}:{i}"
    outputs = tuple(tensor_hash.get(t, "?") for t in g.outputs)
    whole = repr((sorted(node_hash.values()), outputs))
    return hashlib.blake2b(whole.encode(), digest_size=16).hexdigest()
