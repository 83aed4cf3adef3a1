"""A base graph rewritten by a TASO-style rewrite, and what of the state carries over to it:
the F-Tree where the rewrite leaves every F-Tree node's dimensions alone (kept_tree), the
enabled regions (carry_enabled), and whether the rewrite of a program is the edit the base
takes (alike, outside: a pending state; peakcut.optimizer.derive's module doc)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from peakcut.fission.build import find_ftree
from peakcut.fission.dgraph import DGraph
from peakcut.fission.ftree import FTree
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef, map_refs
from peakcut.ir.tags import FissionTag
from peakcut.memory.workspace import WorkspaceSpec
from peakcut.optimizer.state import State, computation_hash
from peakcut.transform import Rewrite


@dataclass(frozen=True)
class Rebased:
    """A base graph after a TASO-style rewrite: order, F-Tree (nothing enabled), D-Graph, digest."""

    base: Graph
    order: tuple[int, ...]
    tree: FTree
    dgraph: DGraph
    digest: str


def rebase(base: Graph, rw: Rewrite, tree: FTree, dgraph: DGraph, levels: int, batch_only: bool,
           workspace: WorkspaceSpec) -> Rebased:
    """`base` (F-Tree `tree`, D-Graph `dgraph`) after rewrite rw, with its F-Tree (all
    disabled), D-Graph and digest: the same tree and D-Graph where the rewrite leaves every
    F-Tree node's dimensions alone (kept_tree), else Algorithm 1 on the new base."""
    order = list(rw.order)
    kept = kept_tree(base, rw, tree)
    if kept is None:
        kept, dgraph = find_ftree(rw.graph, order, levels, batch_only=batch_only, workspace=workspace)
    return Rebased(rw.graph, tuple(order), kept, dgraph, computation_hash(rw.graph, order))


def outside(parent: State, rw: Rewrite) -> bool:
    """Whether a rewrite of parent's program is one the base takes alike (alike), touching
    no recipe's nodes or tensor."""
    held = {v for r in parent.recipes for v in (r.node, *r.users, *r.copies_of)}
    return alike(parent.program, parent.base, rw, held, {r.tensor for r in parent.recipes})


def alike(program: Graph, base: Graph, rw: Rewrite, held: set[int], held_tensors: set[int]) -> bool:
    """Whether rewrite rw of `program` (base with regions expanded, perhaps recipes applied)
    is the edit it makes on `base`:
    - it adds no node, tensor or storage (so no id of the program's part copies can meet an
      id the base rewrite makes);
    - the nodes it removes, and those it rewires, are base nodes outside every region and
      not in `held`, or region nodes (part copies, slices, keep-aliases) rewired only to a
      tensor of the same layout and storage (a view-only rewrite: the region reads the same
      memory, and its original nodes are rewired alike in the base);
    - no node it rewires now reads a tensor a region node makes (a preallocated output:
      expansion makes its readers wait for the last part's write by a control edge, which
      the rewrite would not add);
    - the readers of tensors whose layout it changes are such nodes too, and no tensor of
      `held_tensors` changes or goes.
    Base nodes are compared by value: an earlier rewrite made on the program and on the base
    apart gives equal nodes, not the same objects."""
    if rw.added:
        return False
    new = rw.graph
    if any(t not in program.tensors for t in new.tensors) or any(s not in program.storages
                                                                for s in new.storages):
        return False
    if any(v in held or program.nodes[v] != base.nodes.get(v) for v in rw.removed):
        return False
    producer = program.producer_map()
    for v in rw.changed:
        old = program.nodes[v]
        if v in held or (old != base.nodes.get(v) and not (
                _same_reads(program, old, new, new.nodes[v]) and program.control.get(v) == new.control.get(v))):
            return False
        for t in new.nodes[v].input_tuple:
            p = producer.get(t)
            if t not in old.input_tuple and p is not None and program.nodes[p].tags.get(FissionTag) is not None:
                return False    # a region's output (or slice): its readers wait for its writes
    moved = [t for t, meta in new.tensors.items() if program.tensors[t] is not meta]
    if any(t in held_tensors for t in moved) or any(t not in new.tensors for t in held_tensors):
        return False
    changed = set(rw.changed)     # checked above
    return all(u in changed or (u not in held and program.nodes[u] == base.nodes.get(u))
               for t in moved for u in new.users(t))


def _same_reads(ga: Graph, a: Node, gb: Graph, b: Node) -> bool:
    """a (in ga) and b (in gb) are the same call on tensors of the same layouts and storages."""
    def layout(g: Graph) -> Callable[[TensorRef], tuple]:
        def of(ref: TensorRef) -> tuple:
            m = g.tensors[ref.id]
            return (m.shape, m.stride, m.storage_offset, m.dtype, m.storage)
        return of

    return ((a.op, a.outputs, a.multi_output, a.tags) == (b.op, b.outputs, b.multi_output, b.tags)
            and map_refs(a.args, layout(ga)) == map_refs(b.args, layout(gb))
            and map_refs(a.kwargs, layout(ga)) == map_refs(b.kwargs, layout(gb)))


def kept_tree(base: Graph, rw: Rewrite, tree: FTree) -> FTree | None:
    """The F-Tree update after a rewrite of `base` that adds nothing, removes no node of any
    F-Tree node and makes F-Tree nodes' nodes read tensors of the same layout and storage
    only: every node's dimension rule, hence the D-Graph and the F-Tree, stand (the tree is
    returned with every node disabled). None where the rewrite does anything else (Algorithm 1
    then runs again)."""
    new = rw.graph
    if rw.added or any(t not in base.tensors for t in new.tensors):
        return None
    members: set[int] = set().union(*(f.nodes for f in tree.nodes))
    if any(v in members for v in rw.removed):
        return None
    changed = set(rw.changed)
    if any(v in members and not _same_reads(base, base.nodes[v], new, new.nodes[v]) for v in changed):
        return None
    moved = [t for t, meta in new.tensors.items() if base.tensors[t] is not meta]
    if any(u in members and u not in changed for t in moved for u in new.users(t)):
        return None
    return FTree(tuple(replace(f, n=1) for f in tree.nodes))


def same_regions(a: FTree, b: FTree) -> bool:
    """The same enabled F-Tree nodes: ids, n, nodes and labels."""
    ea, eb = a.enabled(), b.enabled()
    return len(ea) == len(eb) and all(
        f.id == g.id and f.n == g.n and f.nodes == g.nodes and dict(f.labels) == dict(g.labels)
        for f, g in zip(ea, eb, strict=True))


def carry_enabled(old: FTree, new: FTree) -> tuple[FTree, list[int]]:
    """`new` with the nodes enabled that best cover old's enabled ones (Jaccard >= 0.5), at the
    same n where it divides; returns the tree and the old nodes that found no match."""
    lost = []
    for f in old.enabled():
        score, best = max(((len(f.nodes & g.nodes) / len(f.nodes | g.nodes), g.id) for g in new.nodes),
                          default=(0.0, None))
        if best is None or score < 0.5 or new.nodes[best].length % f.n:
            lost.append(f.id)
            continue
        new = new.with_n(best, f.n)
    return new, lost
