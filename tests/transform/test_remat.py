"""Re-materialization and its dual: every reason it does not apply, the rewrite itself, the
control edges that keep a recompute ahead of in-place parameter updates, and round trips."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.node import Phase, TensorRef
from peakcut.ir.serialize import graph_to_json
from peakcut.ir.tags import NodeTags, RematTag
from peakcut.transform import (
    RuleError,
    deremat,
    remat,
    swap,
    why_not_deremat,
    why_not_remat,
)
from peakcut.workloads import get_workload
from tests.conftest import cnn_loss
from tests.transform.conftest import (
    TwoScales,
    node_with_op,
    random_topological_order,
    square_loss,
)


def later_users(g, node):
    """Readers of node's outputs other than the first one (the rule's typical users)."""
    readers = [u for t in g.nodes[node].output_ids() for u in g.users(t)]
    return list(dict.fromkeys(readers))[1:] or readers


def replaced(g, nid, **changes):
    """A copy of g whose node nid has some fields changed (for hand-made broken graphs)."""
    edit = GraphEditor(g)
    edit.replace_node(dataclasses.replace(g.nodes[nid], **changes))
    return edit.finish()


# ---------------------------------------------------------------- reasons
def test_applies_to_a_convolution(cnn_graph):
    g = cnn_graph
    conv = node_with_op(g, "convolution")
    users = [node_with_op(g, "native_batch_norm_backward")]
    assert why_not_remat(g, g.order, conv, users) is None


@pytest.mark.parametrize(("op", "reason"), [
    ("t", "is a view"),
    ("add_.Tensor", "writes .* in place"),
])
def test_refuses_ops(cnn_graph, op, reason):
    g = cnn_graph
    nid = node_with_op(g, op)
    users = [u for t in g.nodes[nid].output_ids() for u in g.users(t)]
    assert why_not_remat(g, g.order, nid, users or [g.order[-1]]) is not None
    with pytest.raises(RuleError, match=reason):
        remat(g, g.order, nid, users or [g.order[-1]])


def test_refuses_unknown_node_and_stale_order(cnn_graph):
    g = cnn_graph
    conv = node_with_op(g, "convolution")
    assert "not in the graph" in why_not_remat(g, g.order, 10**9, [conv])
    assert "stale order" in why_not_remat(g, g.order[:-1], conv, later_users(g, conv))


def test_refuses_opaque_op(cnn_graph):
    g = cnn_graph
    relu = node_with_op(g, "relu")
    bad = replaced(g, relu, op="aten.special_erfcx.default")
    assert "opaque" in why_not_remat(bad, bad.order, relu, later_users(bad, relu))


def test_refuses_random_ops(dropout_graph):
    g = dropout_graph
    noise = node_with_op(g, "randn_like")
    reason = why_not_remat(g, g.order, noise, later_users(g, noise))
    assert "random" in reason and "docs/design.md" in reason
    bernoulli = node_with_op(g, "aten.bernoulli_.float")  # dropout's mask: opaque and in place
    assert why_not_remat(g, g.order, bernoulli, later_users(g, bernoulli)) is not None


def test_refuses_attention_with_dropout(cnn_graph):
    g = cnn_graph
    relu = node_with_op(g, "relu")
    n = g.nodes[relu]
    q = TensorRef(n.input_ids()[0])
    bad = replaced(g, relu, op="aten._scaled_dot_product_efficient_attention.default",
                   args=(q, q, q, None, False), kwargs={"dropout_p": 0.1})
    assert "random" in why_not_remat(bad, bad.order, relu, later_users(bad, relu))


def test_refuses_uninitialized_memory(empty_like_graph):
    g = empty_like_graph
    empty = node_with_op(g, "empty_like")
    users = [u for t in g.nodes[empty].output_ids() for u in g.users(t)]
    assert "uninitialized" in why_not_remat(g, g.order, empty, users)


def test_refuses_swap_ops(cnn_graph):
    g = cnn_graph
    conv = node_with_op(g, "convolution")
    t = g.nodes[conv].outputs[0]
    r = swap(g, g.order, t, [node_with_op(g, "native_batch_norm_backward")])
    store, load = r.added
    for nid in (store, load):
        users = [u for x in r.graph.nodes[nid].output_ids() for u in r.graph.users(x)]
        assert "swap op" in why_not_remat(r.graph, r.order, nid, users)


def test_refuses_output_aliasing_an_input(cnn_graph):
    g = cnn_graph
    t_node = node_with_op(g, "t")  # a view; pretend it is an ordinary (non-view) op
    bad = replaced(g, t_node, op="aten.clone.default", args=g.nodes[t_node].args[:1])
    reason = why_not_remat(bad, bad.order, t_node, later_users(bad, t_node))
    assert "does not allocate" in reason


def test_refuses_program_outputs(cnn_graph):
    g = cnn_graph  # gradients are program outputs
    grad_node = g.producer(g.outputs[g.output_names.index("grad:conv.weight")])
    reason = why_not_remat(g, g.order, grad_node, later_users(g, grad_node))
    assert "program output" in reason


def test_refuses_output_written_in_place_later(inplace_graph):
    g = inplace_graph
    addmm = node_with_op(g, "addmm")
    users = [u for t in g.nodes[addmm].output_ids() for u in g.users(t)]
    assert "written in place later by node relu_" in why_not_remat(g, g.order, addmm, users)


def test_refuses_bad_users(cnn_graph):
    g = cnn_graph
    conv = node_with_op(g, "convolution")
    good = [node_with_op(g, "native_batch_norm_backward")]
    assert "no users" in why_not_remat(g, g.order, conv, [])
    assert "not a node" in why_not_remat(g, g.order, conv, [10**9])
    assert "its own recompute" in why_not_remat(g, g.order, conv, [conv])
    assert "does not read" in why_not_remat(g, g.order, conv, [node_with_op(g, "mm")])
    order = list(g.order)
    order.remove(good[0])
    order.insert(0, good[0])  # not a valid order: the user first
    assert "runs before" in why_not_remat(g, order, conv, good)


def test_refuses_a_view_that_cannot_follow(cnn_graph):
    g = cnn_graph
    relu = node_with_op(g, "relu")
    view = node_with_op(g, "view")  # view(relu): moves with the recompute
    edit = GraphEditor(g)
    edit.set_tensor(dataclasses.replace(g.tensors[g.nodes[view].outputs[0]], storage_offset=10**6))
    bad = edit.finish()
    assert "reaching outside" in why_not_remat(bad, bad.order, relu, [view])


def test_refuses_when_an_update_must_come_first(cnn_graph):
    """Without hazard edges the weight's optimizer update may run first; the recompute of the
    convolution that reads the weight would then have to run before it, yet after its inputs."""
    edit = GraphEditor(cnn_graph)
    for nid in cnn_graph.control:
        edit.set_control(nid, ())
    g = edit.finish()
    conv = node_with_op(g, "convolution")
    update = node_with_op(g, "mul_.Tensor")  # AdamW's weight decay of conv.weight, in place
    assert g.nodes[update].args[0] == TensorRef(g.nodes[node_with_op(g, "detach")].input_ids()[0])
    order = [update] + [n for n in g.order if n != update]
    users = [node_with_op(g, "native_batch_norm_backward")]
    reason = why_not_remat(g, order, conv, users)
    assert "would have to run after" in reason and "mul_" in reason


# ---------------------------------------------------------------- the rewrite
def test_rewrite_shape_and_control_edges(cnn_graph):
    g = cnn_graph
    conv = node_with_op(g, "convolution")
    users = [node_with_op(g, "native_batch_norm_backward")]
    r = remat(g, g.order, conv, users)
    new = r.graph
    check_graph(new)
    (a2,) = r.added
    node = new.nodes[a2]
    assert node.op == g.nodes[conv].op and node.args == g.nodes[conv].args
    assert node.name == "convolution_remat" and node.tags == NodeTags(RematTag(conv))
    (out,) = node.output_ids()
    assert new.tensors[out].storage not in g.storages
    original = g.tensors[g.nodes[conv].outputs[0]]
    assert new.storages[new.tensors[out].storage] == g.storages[original.storage]
    assert TensorRef(out) in new.nodes[users[0]].args
    # placed just before its user; the original graph is untouched
    assert r.order.index(a2) == r.order.index(users[0]) - 1
    assert conv not in g.control.get(users[0], ()) and a2 not in g.nodes
    # in-place updates of conv.weight (storage the recompute reads) now wait for the recompute
    weight_storage = g.tensors[g.inputs[g.input_names.index("param:conv.weight")]].storage
    writers = [n for n in new.order if any(new.tensors[t].storage == weight_storage
                                           for t in new.mutated_tensors(n))]
    assert writers, "AdamW updates conv.weight in place"
    for m in writers:
        assert a2 in new.control[m]
        assert r.order.index(a2) < r.order.index(m)
    assert set(r.changed) == {*users, *writers}
    assert "recompute node convolution" in r.description and "conv" in r.description


def test_control_edge_keeps_the_recompute_before_the_parameter_update():
    """x * p1 recomputed for p2's gradient: in orders that run the recompute as late as they
    may, the numbers match eager only thanks to the control edge before p1's update."""
    torch.manual_seed(0)
    model, batch = TwoScales(), (torch.randn(4, 8),)
    g = peakcut.capture(model, batch, square_loss, "adamw", keep_grads=True)
    x_p1 = node_with_op(g, "mul.Tensor")
    (product,) = g.nodes[x_p1].output_ids()
    late_user = g.users(product)[-1]
    r = remat(g, g.order, x_p1, [late_user])
    (a2,) = r.added
    p1 = g.tensors[g.inputs[g.input_names.index("param:p1")]].storage
    updates = [m for m in g.order if any(g.tensors[t].storage == p1 for t in g.mutated_tensors(m))]
    assert updates and all(a2 in r.graph.control[m] for m in updates)
    edit = GraphEditor(r.graph)
    for k, v in r.graph.control.items():
        edit.set_control(k, (p for p in v if p != a2))
    unguarded = edit.finish()
    for graph, expect in ((r.graph, True), (unguarded, False)):
        order = random_topological_order(graph, seed=0, defer=[a2])
        report = peakcut.check_equivalence(
            copy.deepcopy(model), batch, square_loss, peakcut.AdamW(),
            lambda _m, graph=graph, order=order: Step(graph, order), steps=2)
        assert report.ok is expect, str(report)


def test_multi_output_op(cnn_graph):
    g = cnn_graph
    ln = node_with_op(g, "native_layer_norm")
    users = later_users(g, ln)
    r = remat(g, g.order, ln, users)
    check_graph(r.graph)
    (a2,) = r.added
    assert len(r.graph.nodes[a2].output_ids()) == 3 and r.graph.nodes[a2].multi_output


def test_views_made_by_users_follow_the_recompute(cnn_graph):
    g = cnn_graph
    relu = node_with_op(g, "relu")
    view = node_with_op(g, "view")
    r = remat(g, g.order, relu, [view])
    check_graph(r.graph)
    (a2,) = r.added
    (out,) = r.graph.nodes[a2].output_ids()
    (v,) = r.graph.nodes[view].output_ids()
    assert r.graph.tensors[v].storage == r.graph.tensors[out].storage


def test_remat_of_a_remat(cnn_graph):
    g = cnn_graph
    relu = node_with_op(g, "relu")
    r1 = remat(g, g.order, relu, [node_with_op(g, "view")])
    (a2,) = r1.added
    users = [u for t in r1.graph.nodes[a2].output_ids() for u in r1.graph.users(t)]
    r2 = remat(r1.graph, r1.order, a2, users)
    check_graph(r2.graph)
    assert r2.graph.nodes[r2.added[0]].tags == NodeTags(RematTag(a2))


# ---------------------------------------------------------------- de-remat
@pytest.mark.parametrize(("op", "users_of"), [
    ("convolution", lambda g: [node_with_op(g, "native_batch_norm_backward")]),
    ("native_layer_norm", lambda g: later_users(g, node_with_op(g, "native_layer_norm"))),
    ("relu", lambda g: [node_with_op(g, "view")]),
])
def test_round_trip_gives_back_the_graph(cnn_graph, op, users_of):
    g = cnn_graph
    r = remat(g, g.order, node_with_op(g, op), users_of(g))
    back = deremat(r.graph, r.order, r.added[0])
    check_graph(back.graph)
    assert graph_to_json(back.graph) == graph_to_json(g)
    assert back.order == g.order and back.removed == r.added


def test_deremat_reasons(cnn_graph):
    g = cnn_graph
    conv = node_with_op(g, "convolution")
    bnb = node_with_op(g, "native_batch_norm_backward")
    r = remat(g, g.order, conv, [bnb])
    new, order, (a2,) = r.graph, r.order, r.added
    assert why_not_deremat(new, order, a2) is None
    assert "not in the graph" in why_not_deremat(new, order, 10**9)
    assert "stale order" in why_not_deremat(new, order[:-1], a2)
    assert "not a recompute" in why_not_deremat(new, order, conv)
    gone = replaced(new, a2, tags=NodeTags(RematTag(10**9)))
    assert "no longer in the graph" in why_not_deremat(gone, order, a2)
    differs = replaced(new, a2, kwargs={"bogus": 1})
    assert "no longer computes the same" in why_not_deremat(differs, order, a2)
    relu = node_with_op(g, "relu")
    alone = remat(g, g.order, relu, later_users(g, relu) + [node_with_op(g, "detach", 7)])
    assert not [u for t in g.nodes[relu].output_ids() for u in alone.graph.users(t)]
    moved = [n for n in alone.order if n != relu] + [relu]  # valid: the original has no reader
    assert "runs before the original" in why_not_deremat(alone.graph, moved, alone.added[0])
    writer = replaced(new, node_with_op(new, "native_batch_norm"), op="aten.relu_.default",
                      args=(TensorRef(g.nodes[conv].outputs[0]),), kwargs={})
    assert "writes an output" in why_not_deremat(writer, order, a2)
    edit = GraphEditor(new)
    edit.set_interface(outputs=[*new.outputs, new.nodes[a2].outputs[0]],
                       output_names=[*new.output_names, "out:extra"])
    out = edit.finish()
    assert "program output" in why_not_deremat(out, order, a2)
    with pytest.raises(RuleError, match="not a recompute"):
        deremat(new, order, conv)


def test_remat_and_deremat_match_eager(cnn, cnn_graph):
    """Remat then de-remat: same numbers as eager (and as the untouched graph)."""
    model, batch = cnn
    g = cnn_graph
    r = remat(g, g.order, node_with_op(g, "relu"), [node_with_op(g, "view")])
    back = deremat(r.graph, r.order, r.added[0])
    for graph, order in ((r.graph, r.order), (back.graph, back.order)):
        report = peakcut.check_equivalence(copy.deepcopy(model), batch, cnn_loss, peakcut.AdamW(),
                                           lambda _m, graph=graph, order=order: Step(graph, order),
                                           steps=2)
        assert report.ok, str(report)


def test_training_batch_norm_is_recomputed_by_its_own_kernel(cnn, cnn_graph):
    """A training batch norm's recompute is the same kernel without its running statistics: the
    same result bit for bit (a relu's backward reading it sees the forward's mask; a normalize
    from the saved statistics rounds differently in some shapes), no running statistics written
    twice (check_equivalence compares the buffers), and de-remat gives back the graph."""
    model, batch = cnn
    g = cnn_graph
    bn = node_with_op(g, "native_batch_norm")
    assert g.mutated_tensors(bn)    # the forward's own call writes the running statistics
    r = remat(g, g.order, bn, later_users(g, bn))
    (added,) = (r.graph.nodes[a] for a in r.added)
    assert added.op == g.nodes[bn].op and added.tags.get(RematTag) == RematTag(bn)
    assert not r.graph.mutated_tensors(added.id)
    report = peakcut.check_equivalence(copy.deepcopy(model), batch, cnn_loss, peakcut.AdamW(),
                                       lambda _m: Step(r.graph, r.order), steps=2)
    assert report.ok, str(report)
    back = deremat(r.graph, r.order, r.added[0])
    assert graph_to_json(back.graph) == graph_to_json(g)
    assert back.order == g.order and set(back.removed) == set(r.added)


def test_a_batch_norm_rerun_without_running_statistics_is_bit_identical():
    """What the recompute relies on, on the machine at hand: the kernel run again on the same
    input without running statistics gives the same result and statistics bit for bit (shapes
    where a normalize from the saved statistics does not)."""
    torch.manual_seed(0)
    for shape in ((6, 128, 64, 64), (2, 8, 5, 7)):
        x, w, b = torch.randn(shape), torch.randn(shape[1]), torch.randn(shape[1])
        first = torch.ops.aten.native_batch_norm(x, w, b, torch.zeros(shape[1]), torch.ones(shape[1]),
                                                 True, 0.1, 1e-5)
        again = torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
        assert all(torch.equal(p, q) for p, q in zip(first, again, strict=True))


class NormActs(torch.nn.Module):
    """conv -> batch norm (affine or not) -> relu, twice: relu's backward and the next conv's
    read relu's output, the batch norm's backward reads the conv's. The convolutions have no bias,
    as in real CNNs: a bias before a batch norm has a gradient of rounding noise only, which
    AdamW scales up to full steps that no two programs take alike."""

    def __init__(self, affine: bool) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 6, 3, padding=1, bias=False), torch.nn.BatchNorm2d(6, affine=affine), torch.nn.ReLU(),
            torch.nn.Conv2d(6, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4, affine=affine), torch.nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.parametrize(("dtype", "affine", "channels_last"), [
    (torch.float32, True, False), (torch.float64, False, False), (torch.float32, True, True)])
def test_batch_norm_and_activation_recomputed_for_the_backward(dtype, affine, channels_last):
    """The pair compile's partitioner recomputes: each relu's backward readers read a recompute
    of the relu, which reads a recompute of the batch norm (its kernel again, without running
    statistics); the step gives eager's numbers (loss, gradients, parameters, running
    statistics, AdamW state) over 3 steps."""
    torch.manual_seed(0)
    model = NormActs(affine).to(dtype)
    x = torch.randn(3, 3, 6, 6, dtype=dtype)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    g = peakcut.capture(model, (x,), square_loss, "adamw", keep_grads=True)
    order = list(g.order)
    for bn in [v for v in g.order if g.nodes[v].op == "aten.native_batch_norm.default"]:
        (relu,) = {u for u in g.users(g.nodes[bn].outputs[0])}
        r = remat(g, order, relu, later_users(g, relu))
        g, order = r.graph, r.order
        (relu2,) = r.added
        r = remat(g, order, bn, [relu2])
        g, order = r.graph, r.order
        check_graph(g)
    assert sum(g.nodes[v].op == "aten.native_batch_norm.default" for v in g.order) == 4
    report = peakcut.check_equivalence(copy.deepcopy(model), (x,), square_loss, peakcut.AdamW(),
                                       lambda _m: Step(g, order), steps=3)
    assert report.ok, str(report)


def test_inputs_are_untouched(cnn_graph):
    g = cnn_graph
    before = graph_to_json(g)
    remat(g, g.order, node_with_op(g, "convolution"),
          [node_with_op(g, "native_batch_norm_backward")])
    assert graph_to_json(g) == before


@pytest.mark.parametrize("kind", ["remat", "swap"])
def test_readers_of_the_forwards_detach_read_the_copy(kind):
    """The autograd capture reads a saved relu output in the backward through the forward's
    detach of it. remat of that detach (or of the relu) and swap of the relu's output serve
    readers of either; afterwards nothing after the forward reads the original or its detach,
    and the step gives eager's numbers (tiny ResNet-50, 2 AdamW steps)."""
    w = get_workload("resnet50").build("tiny")
    g = peakcut.capture(w.model, w.batch, w.loss_fn, "adamw", keep_grads=True)
    relu = next(v for v in g.order if g.nodes[v].op == "aten.relu.default"
                and any(g.nodes[u].op == "aten.detach.default" for u in g.users(g.nodes[v].outputs[0])))
    (out,) = g.nodes[relu].output_ids()
    detach = next(u for u in g.users(out) if g.nodes[u].op == "aten.detach.default")
    (view,) = g.nodes[detach].output_ids()
    backward = {v for v in g.order if g.nodes[v].phase is not Phase.FORWARD}
    users = [u for u in g.order if u in backward and u in {*g.users(out), *g.users(view)}]
    assert any(u in g.users(view) for u in users)
    if kind == "remat":
        r = remat(g, g.order, detach, users)
        assert r.graph.nodes[r.added[0]].tags.get(RematTag) == RematTag(relu)
        assert why_not_remat(g, g.order, relu, users) is None
    else:
        r = swap(g, g.order, out, users)
    check_graph(r.graph)
    assert not [u for t in (out, view) for u in r.graph.users(t) if u in backward]
    report = peakcut.check_equivalence(copy.deepcopy(w.model), w.batch, w.loss_fn, peakcut.AdamW(),
                                       lambda _m: Step(r.graph, r.order), steps=2)
    assert report.ok, str(report)
