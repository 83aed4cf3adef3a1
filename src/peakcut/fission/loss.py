"""Let fission regions span the loss: two exact rewrites of the captured loss.

A region that runs forward, loss and backward in parts (micro-batching, the
F-Trans that saves activations) is blocked by two edges that carry no batch
dimension:

- the gradient seed `ones_like(loss)` depends on the loss value, so a path
  leaves the region (loss) and comes back (seed -> backward): not convex.
  The seed is all ones whatever the loss is: it becomes a `scalar_tensor(1.0)`
  with no input.
- `nll_loss_backward` / `nll_loss2d_backward` (reduction=mean) read the forward's `total_weight`, the
  number of counted targets of the WHOLE batch. Each part needs the whole
  batch's count, known only after every part's forward. The count depends on
  the targets alone, so it is computed up front: `sum(target != ignore_index)`
  (unweighted losses only; a weighted loss is left alone).

Both give the same numbers bit for bit: ones are ones, and the count of
non-ignored targets is an integer, exact in float32 below 2**24.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.tensor import Role, TensorMeta, contiguous_strides
from peakcut.transform.rewrite import RewrittenFromTag

EXACT_COUNT = 2**24  # float32 holds every integer up to here
NLL_BACKWARD = ("aten.nll_loss_backward.default", "aten.nll_loss2d_backward.default")


def detach_loss(g: Graph) -> Graph:
    """A copy of `g` with the loss's gradient seed and target count computed without the loss."""
    edit = GraphEditor(g)
    new = edit.graph
    for nid in list(g.order):
        node = new.nodes[nid]
        if node.op == "aten.ones_like.default" and not new.tensors[node.args[0].id].shape:
            (out,) = node.output_ids()
            edit.replace_node(Node(
                id=nid, op="aten.scalar_tensor.default", args=(1.0,),
                kwargs={"dtype": new.tensors[out].torch_dtype, "device": torch.device(g.device)},
                outputs=node.outputs, module=node.module, phase=node.phase, name=node.name,
                tags=node.tags.with_tag(RewrittenFromTag("ones_like"))))
        elif node.op in NLL_BACKWARD and _unweighted_mean(node):
            target = node.args[2]
            meta = new.tensors[target.id]
            if meta.numel >= EXACT_COUNT:
                continue
            ignore = node.args[5]
            tw_old = new.tensors[node.args[6].id]
            mask_id = edit.new_id()
            mask = TensorMeta(mask_id, meta.shape, contiguous_strides(meta.shape), "bool",
                              edit.add_storage(max(1, meta.numel)), 0, Role.ACTIVATION,
                              f"{meta.name or target.id}_counted")
            count_id = edit.new_id()
            count = TensorMeta(count_id, (), (), tw_old.dtype, edit.add_storage(tw_old.itemsize), 0,
                               Role.ACTIVATION, f"{tw_old.name or 'total_weight'}_upfront")
            ne = Node(id=edit.new_id(), op="aten.ne.Scalar", args=(target, ignore), kwargs={},
                      outputs=(mask.id,), module=node.module, phase=node.phase,
                      name=f"{node.name}_counted")
            total = Node(id=edit.new_id(), op="aten.sum.dim_IntList", args=(TensorRef(mask.id), []),
                         kwargs={"dtype": tw_old.torch_dtype}, outputs=(count.id,),
                         module=node.module, phase=node.phase, name=f"{node.name}_total_weight")
            edit.add_node(ne, [mask])
            edit.add_node(total, [count])
            args = list(node.args)
            args[6] = TensorRef(count.id)
            edit.replace_node(replace(node, args=tuple(args)))
            edit.insert_in_order(new.order.index(nid), [ne.id, total.id])
    return edit.finish()


def _unweighted_mean(node: Node) -> bool:
    return len(node.args) >= 7 and node.args[3] is None and node.args[4] == 1

