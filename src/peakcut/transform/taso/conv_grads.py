"""split_conv_grads: a convolution's backward that makes both its input gradient and its
weight (or bias) gradient runs as two calls: the weight and bias gradients first, then the
input gradient.

    aten.convolution_backward(gy, x, W, ..., [True, True, b])
      ->  _, gW, gb = aten.convolution_backward(gy, x, W, ..., [False, True, b])
          gx, _, _  = aten.convolution_backward(gy, x, W, ..., [True, False, False])

Why: ATen computes the two gradients one after the other in one call (oneDNN's backward-data,
then backward-weights; cuDNN's likewise), so the input gradient it made first is held while the
weight gradient's scratch is taken. Split, the weight gradient's scratch is taken before the
input gradient exists, and x, when the backward was its last reader, can be freed before the
input gradient is made. Where a CNN's step peaks at a convolution's backward (U-Net's and
U-Net++'s do, at paper size), that is up to the input gradient's bytes off the peak. What it
costs: grad_output is read by two calls instead of one, and one more call is dispatched; the
simulator prices both.

Numbers: each call runs the same kernel on the same inputs as the one call did (ATen's
convolution_backward dispatches per requested gradient), so the results are bit for bit the
same (checked in tests/transform/test_conv_grads.py on every CPU backend the suite meets).

Refused, naming the node: another op, a call that makes only one kind of gradient, keyword
arguments, a recompute (a checkpoint's copy of the node).
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.registry import CONV_BACKWARD, conv_backward_mask
from peakcut.ir.tags import RematTag
from peakcut.transform.rewrite import (
    Rewrite,
    RuleError,
    compose_rewrites,
    describe_node,
    node_calling,
)
from peakcut.transform.taso.edit import Edit
from peakcut.transform.taso.tag import TasoTag

RULE = "split_conv_grads"
_MASK = 10          # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding,
#                     dilation, transposed, output_padding, groups, output_mask)


def why_not_split_conv_grads(g: Graph, order: Sequence[int], nid: int, *, checked: bool = False) -> str | None:
    """Why split_conv_grads does not apply to node `nid` (None when it does). checked: the
    caller has verified that `order` is an order of g."""
    node = node_calling(g, order, nid, CONV_BACKWARD, "a convolution's backward", checked=checked)
    if isinstance(node, str):
        return node
    what = describe_node(g, nid)
    if node.kwargs:
        return f"{what} takes keyword arguments {sorted(node.kwargs)}"
    mask = conv_backward_mask(node.args)
    if mask is None:
        return f"{what} has no output mask of three"
    outs = (list(node.outputs) + [None, None, None])[:3]
    if not (mask[0] and outs[0] is not None):
        return f"{what} makes no input gradient"
    if not ((mask[1] and outs[1] is not None) or (mask[2] and outs[2] is not None)):
        return f"{what} makes no weight or bias gradient"
    if node.tags.get(RematTag) is not None:
        return f"{what} is a recompute (its checkpoint would lose track of the calls)"
    return None


def _split_one(g: Graph, order: Sequence[int], nid: int) -> Rewrite:
    """The backward `nid` as a weight-and-bias call and an input call (module doc)."""
    node = g.nodes[nid]
    label = node.name or str(nid)
    edit = Edit(g, order, RULE)
    mask = conv_backward_mask(node.args)
    if mask is None:
        raise RuleError(f"{describe_node(g, nid)} has no output mask of three")
    grad_in, grad_w, grad_b = (list(node.outputs) + [None, None, None])[:3]
    keep_w = mask[1] and grad_w is not None
    keep_b = mask[2] and grad_b is not None
    head = node.args[:_MASK]
    weights = edit.add(CONV_BACKWARD, (*head, [False, keep_w, keep_b]), name=f"{label}_weight",
                       phase=node.phase, module=node.module, multi_output=True,
                       tag=TasoTag(RULE, part=0, part_of=label),
                       outputs=[None, grad_w if keep_w else None, grad_b if keep_b else None])
    inputs = edit.add(CONV_BACKWARD, (*head, [True, False, False]), name=f"{label}_input",
                      phase=node.phase, module=node.module, multi_output=True,
                      tag=TasoTag(RULE, part=1, part_of=label), outputs=[grad_in, None, None])
    handed = [t for t, kept in ((grad_in, True), (grad_w, keep_w), (grad_b, keep_b)) if kept and t is not None]
    unread = [t for t, kept in ((grad_w, keep_w), (grad_b, keep_b)) if t is not None and not kept]
    if any(g.users(t) or t in g.outputs for t in unread):
        raise RuleError(f"{describe_node(g, nid)} makes a gradient its output mask does not ask for")
    edit.remove(nid, stand_ins=(weights.id, inputs.id), handed_on=handed)
    edit.inherit.update({a: (nid,) for a in edit.added})
    return edit.finish([nid], f"{describe_node(g, nid)} runs as two calls: its weight gradient, then its "
                              "input gradient")


def split_conv_grads(g: Graph, order: Sequence[int], nodes: Sequence[int]) -> Rewrite:
    """Every convolution backward among `nodes` runs as two calls (module doc). Raises
    RuleError (the reason of why_not_split_conv_grads) where the rule does not apply."""
    steps: list[Rewrite] = []
    h, o = g, list(order)
    for nid in nodes:
        reason = why_not_split_conv_grads(h, o, nid)
        if reason:
            raise RuleError(reason)
        rw = _split_one(h, o, nid)
        steps.append(rw)
        h, o = rw.graph, rw.order
    if not steps:
        raise RuleError("no convolution backward to split")
    if len(steps) == 1:
        return steps[0]
    return compose_rewrites(g, steps, f"{len(steps)} convolution backwards run as two calls each: weight "
                                      "gradient, then input gradient")


def conv_grads_sites(g: Graph, order: Sequence[int]) -> list[int]:
    """Every convolution backward the rule applies to, in `order`."""
    return [v for v in order if g.nodes[v].op == CONV_BACKWARD
            and why_not_split_conv_grads(g, order, v, checked=True) is None]
