"""Prepare a graph for fission: one view node per reader.

A view that several nodes read (an activation reshaped once in the forward
pass and read again by the backward) ties a forward region to everything
outside it: the region would hand out a view, which the split program cannot
merge into. Views cost nothing, so each extra reader gets its own copy of the
view node (same op, same arguments). A region then hands out the view's base,
which its producer allocates, and the copy outside runs on the merged base.
Memory and numbers are unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef, map_refs
from peakcut.ir.registry import OpKind, lookup


def split_shared_views(g: Graph) -> Graph:
    """A copy of `g` where every single-output view node has at most one reader."""
    new = g.copy()
    next_id = new.next_id()
    order = list(new.order)
    for nid in list(g.order):
        node = new.nodes[nid]
        info = lookup(node.op)
        if info is None or info.kind is not OpKind.VIEW or len(node.output_ids()) != 1:
            continue
        (out,) = node.output_ids()
        readers = list(dict.fromkeys(new.users(out)))
        if len(readers) < 2 or out in new.outputs:
            continue
        for reader in readers[1:]:
            meta = new.tensors[out]
            copy_out = replace(meta, id=next_id, name=f"{meta.name or out}_{len(order)}")
            copy = replace(node, id=next_id + 1, outputs=(copy_out.id,), name=f"{node.name}_for_{new.nodes[reader].name}")
            next_id += 2
            new.add_node(copy, [copy_out])
            old = new.nodes[reader]
            new.replace_node(replace(
                old,
                args=map_refs(old.args, lambda r, o=out, c=copy_out.id: TensorRef(c) if r.id == o else r),
                kwargs=map_refs(old.kwargs, lambda r, o=out, c=copy_out.id: TensorRef(c) if r.id == o else r),
            ))
            if nid in new.control:
                new.control[copy.id] = new.control[nid]
            order.insert(order.index(reader), copy.id)
    new.order = order
    new.changed()
    return new
