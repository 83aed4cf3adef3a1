"""Swapping and its dual: every reason it does not apply, the rewrite itself (store right after
the producer, load right before the first user, views follow the loaded copy), and round trips."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.serialize import graph_to_json
from peakcut.ir.tags import NO_TAGS, NodeTags, SwapTag
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.memory import simulate
from peakcut.transform import RuleError, deswap, swap, why_not_deswap, why_not_swap
from peakcut.transform.rewrite import why_not_move
from peakcut.transform.swap import is_dense
from tests.conftest import cnn_loss
from tests.transform.conftest import (
    SliceMLP,
    TwoScales,
    mlp_batch,
    mlp_loss,
    node_with_op,
    square_loss,
)


def out(g, op, nth=0):
    return g.nodes[node_with_op(g, op, nth)].outputs[0]


def with_meta(g, tid, **changes):
    """A copy of g with tensor tid's meta changed."""
    edit = GraphEditor(g)
    edit.set_tensor(dataclasses.replace(g.tensors[tid], **changes))
    return edit.finish()


def input_named(g, name):
    return g.inputs[g.input_names.index(name)]


# ---------------------------------------------------------------- reasons
def test_applies_to_an_activation(cnn_graph):
    g = cnn_graph
    conv = out(g, "convolution")
    assert why_not_swap(g, g.order, conv, [node_with_op(g, "native_batch_norm_backward")]) is None


@pytest.mark.parametrize("name", ["param:conv.weight", "state:conv.weight.exp_avg",
                                  "buffer:bn.running_mean", "batch:0"])
def test_never_swaps_caller_held_tensors(cnn_graph, name):
    g = cnn_graph
    t = input_named(g, name)
    reason = why_not_swap(g, g.order, t, g.users(t))
    assert "held by the caller" in reason and "never swapped" in reason
    with pytest.raises(RuleError, match="held by the caller"):
        swap(g, g.order, t, g.users(t))


def test_refuses_unknown_tensor_and_stale_order(cnn_graph):
    g = cnn_graph
    conv = out(g, "convolution")
    assert "not in the graph" in why_not_swap(g, g.order, 10**9, [g.order[0]])
    assert "stale order" in why_not_swap(g, g.order[:-1], conv, g.users(conv))


def test_refuses_swap_results(cnn_graph):
    g = cnn_graph
    conv = out(g, "convolution")
    r = swap(g, g.order, conv, [node_with_op(g, "native_batch_norm_backward")])
    store, load = (r.graph.nodes[n] for n in r.added)
    (host,) = store.output_ids()
    (loaded,) = load.output_ids()
    assert "host memory" in why_not_swap(r.graph, r.order, host, [load.id])
    assert "made by a swap op" in why_not_swap(r.graph, r.order, loaded, r.graph.users(loaded))
    # the store keeps reading the original: it is not a user to rewire
    assert "swap op" in why_not_swap(r.graph, r.order, conv, [store.id])


def test_refuses_tensor_without_producer(cnn_graph):
    m = cnn_graph.tensors[out(cnn_graph, "relu")]
    orphan = TensorMeta(10**6, m.shape, m.stride, m.dtype, m.storage, 0, Role.ACTIVATION, "orphan")
    edit = GraphEditor(cnn_graph)
    edit.set_tensor(orphan)
    g = edit.finish()
    assert "no producer" in why_not_swap(g, g.order, orphan.id, [node_with_op(g, "view")])


def test_refuses_program_outputs(cnn_graph):
    g = cnn_graph  # keep_grads: gradients are outputs
    loss = g.outputs[0]
    assert "program output" in why_not_swap(g, g.order, loss, [g.order[-1]])
    grad = g.outputs[g.output_names.index("grad:conv.weight")]
    assert "program output" in why_not_swap(g, g.order, grad, g.users(grad) or [g.order[-1]])


def test_refuses_empty_tensor(cnn_graph):
    g = cnn_graph
    relu = out(g, "relu")
    bad = with_meta(g, relu, shape=(0, 4, 8, 8))
    assert "empty" in why_not_swap(bad, bad.order, relu, [node_with_op(g, "view")])


def test_refuses_non_dense_tensor():
    torch.manual_seed(0)
    g = peakcut.capture(TwoScales(), (torch.randn(4, 8),), square_loss, "adamw")
    expand = out(g, "expand")
    assert not is_dense(g.tensors[expand].shape, g.tensors[expand].stride)
    assert "not non-overlapping and dense" in why_not_swap(g, g.order, expand, g.users(expand))


class WrittenLater(nn.Module):
    """fc1's output is summed, then scaled in place, then read again (a running sum's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc1(x)
        s = a.sum()
        return self.fc2(torch.tanh(a.mul_(2.0))) + s


@pytest.fixture(scope="module")
def written_later() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], Graph]:
    torch.manual_seed(0)
    model, batch = WrittenLater(), mlp_batch()
    return model, batch, peakcut.capture(model, batch, mlp_loss, "adamw", keep_grads=True)


def test_refuses_tensor_overwritten_later_unless_every_use_follows(written_later):
    _, _, g = written_later
    a = out(g, "addmm")     # then mul_ writes it in place
    writer = node_with_op(g, "mul_.Tensor")
    # the sum would keep reading the original: the write must land on one copy that all read
    assert "mul_ (aten.mul_.Tensor) in WrittenLater writes the storage" in why_not_swap(g, g.order, a, [writer])
    assert why_not_swap(g, g.order, a, g.users(a)) is None
    # the in-place op's own result is fine: nothing writes it afterwards
    scaled = g.nodes[writer].outputs[0]
    assert why_not_swap(g, g.order, scaled, g.users(scaled)) is None


def test_swapped_out_before_an_in_place_write_matches_eager(written_later):
    model, batch, g = written_later
    a = out(g, "addmm")
    r = swap(g, g.order, a, g.users(a))
    check_graph(r.graph)
    writer = node_with_op(g, "mul_.Tensor")
    (loaded,) = r.graph.nodes[r.added[1]].output_ids()
    # the write and what reads its result follow the loaded copy
    assert r.graph.tensors[r.graph.nodes[writer].outputs[0]].storage == r.graph.tensors[loaded].storage
    report = peakcut.check_equivalence(copy.deepcopy(model), batch, mlp_loss, peakcut.AdamW(),
                                       lambda _m: Step(r.graph, r.order), steps=2)
    assert report.ok, str(report)


def test_a_second_swap_loads_the_same_host_copy(written_later):
    model, batch, g = written_later
    t = out(g, "tanh")      # read forward by fc2, backward by fc2's weight gradient
    r1 = swap(g, g.order, t, [max(g.users(t), key=g.order.index)])
    r2 = swap(r1.graph, r1.order, t, [node_with_op(g, "addmm", 1)])
    check_graph(r2.graph)
    assert len(r2.added) == 1 and r2.graph.nodes[r2.added[0]].op == LOAD_OP
    assert [n for n in r2.graph.nodes.values() if n.op == STORE_OP] == [r2.graph.nodes[r1.added[0]]]
    report = peakcut.check_equivalence(copy.deepcopy(model), batch, mlp_loss, peakcut.AdamW(),
                                       lambda _m: Step(r2.graph, r2.order), steps=2)
    assert report.ok, str(report)
    back = deswap(r2.graph, r2.order, r2.added[0])     # the other load still reads the host copy
    assert back.removed == r2.added and r1.added[0] in back.graph.nodes


def test_refuses_bad_users(cnn_graph):
    g = cnn_graph
    conv = out(g, "convolution")
    bnb = node_with_op(g, "native_batch_norm_backward")
    assert "no users" in why_not_swap(g, g.order, conv, [])
    assert "not a node" in why_not_swap(g, g.order, conv, [10**9])
    assert "does not read" in why_not_swap(g, g.order, conv, [node_with_op(g, "mm")])
    order = [bnb] + [n for n in g.order if n != bnb]
    assert "runs before the producer" in why_not_swap(g, order, conv, [bnb])


def test_refuses_a_view_that_cannot_follow(cnn_graph):
    g = cnn_graph
    relu = out(g, "relu")
    view = node_with_op(g, "view")
    bad = with_meta(g, g.nodes[view].outputs[0], storage_offset=10**6)
    assert "reaching outside" in why_not_swap(bad, bad.order, relu, [view])


def test_view_output_guard(cnn_graph):
    """Views of a rewired tensor that are program outputs never move (the storage-level output
    check refuses first; the guard itself is checked here)."""
    v = out(cnn_graph, "view")
    edit = GraphEditor(cnn_graph)
    edit.set_interface(outputs=[*cnn_graph.outputs, v], output_names=[*cnn_graph.output_names, "out:v"])
    g = edit.finish()
    assert "program output" in why_not_move(g, [v], g.storages[g.tensors[v].storage], 0)


# ---------------------------------------------------------------- the rewrite
def test_rewrite_shape(cnn_graph):
    g = cnn_graph
    conv = out(g, "convolution")
    producer = g.producer(conv)
    bnb = node_with_op(g, "native_batch_norm_backward")
    r = swap(g, g.order, conv, [bnb])
    new = r.graph
    check_graph(new)
    store, load = (new.nodes[n] for n in r.added)
    assert store.op == STORE_OP and load.op == LOAD_OP
    assert store.tags == load.tags == NodeTags(SwapTag(conv))
    assert load.kwargs == {"device": torch.device("cpu")}
    (host,) = store.output_ids()
    (loaded,) = load.output_ids()
    meta = g.tensors[conv]
    for t in (host, loaded):
        m = new.tensors[t]
        assert (m.shape, m.stride, m.dtype) == (meta.shape, meta.stride, meta.dtype)
        assert m.storage_offset == 0
        assert new.storages[m.storage] == meta.nbytes
    assert new.host_storages() == {new.tensors[host].storage}
    assert r.order.index(store.id) == r.order.index(producer) + 1
    assert r.order.index(load.id) == r.order.index(bnb) - 1
    assert loaded in new.nodes[bnb].input_ids() and conv not in new.nodes[bnb].input_ids()
    assert r.changed == (bnb,) and r.removed == ()
    assert "swap tensor convolution" in r.description
    # the host copy is not device memory; the original is freed after its last forward reader
    prof_before, prof_after = simulate(g, g.order), simulate(new, r.order)
    storage = meta.storage
    assert prof_after.storage_lifetime[storage][1] < prof_before.storage_lifetime[storage][1]
    assert new.tensors[host].storage not in prof_after.storage_lifetime


def test_views_follow_the_loaded_copy_at_the_right_offset(slice_graph):
    g = slice_graph
    bottom = out(g, "slice.Tensor")  # h[3:], storage offset 48
    assert g.tensors[bottom].storage_offset == 48
    view = node_with_op(g, "view")
    r = swap(g, g.order, bottom, [view])
    check_graph(r.graph)
    (loaded,) = r.graph.nodes[r.added[1]].output_ids()
    v = r.graph.tensors[g.nodes[view].outputs[0]]
    assert v.storage == r.graph.tensors[loaded].storage and v.storage_offset == 0


def test_swapped_steps_match_eager(cnn, cnn_graph):
    model, batch = cnn
    g = cnn_graph
    r1 = swap(g, g.order, out(g, "convolution"), [node_with_op(g, "native_batch_norm_backward")])
    r2 = swap(r1.graph, r1.order, out(g, "relu"), [node_with_op(g, "view")])
    report = peakcut.check_equivalence(copy.deepcopy(model), batch, cnn_loss, peakcut.AdamW(),
                                       lambda _m: Step(r2.graph, r2.order), steps=2)
    assert report.ok, str(report)


def test_offset_views_match_eager(slice_graph):
    torch.manual_seed(0)
    model, batch = SliceMLP(), mlp_batch()
    g = slice_graph
    r = swap(g, g.order, out(g, "slice.Tensor"), [node_with_op(g, "view")])
    report = peakcut.check_equivalence(model, batch, mlp_loss, peakcut.AdamW(),
                                       lambda _m: Step(r.graph, r.order), steps=2)
    assert report.ok, str(report)


# ---------------------------------------------------------------- de-swap
@pytest.mark.parametrize(("op", "user"), [("convolution", "native_batch_norm_backward"),
                                          ("relu", "view")])
def test_round_trip_gives_back_the_graph(cnn_graph, op, user):
    g = cnn_graph
    r = swap(g, g.order, out(g, op), [node_with_op(g, user)])
    back = deswap(r.graph, r.order, r.added[1])
    check_graph(back.graph)
    assert graph_to_json(back.graph) == graph_to_json(g)
    assert back.order == g.order and set(back.removed) == set(r.added)


def test_round_trip_with_offset(slice_graph):
    g = slice_graph
    r = swap(g, g.order, out(g, "slice.Tensor"), [node_with_op(g, "view")])
    back = deswap(r.graph, r.order, r.added[1])
    assert graph_to_json(back.graph) == graph_to_json(g)


def test_deswap_reasons(cnn_graph):
    g = cnn_graph
    conv = out(g, "convolution")
    r = swap(g, g.order, conv, [node_with_op(g, "native_batch_norm_backward")])
    new, order = r.graph, r.order
    store, load = r.added
    assert why_not_deswap(new, order, load) is None
    assert "not in the graph" in why_not_deswap(new, order, 10**9)
    assert "stale order" in why_not_deswap(new, order[:-1], load)
    assert "not a load" in why_not_deswap(new, order, store)

    def edited(**changes):
        edit = GraphEditor(new)
        edit.replace_node(dataclasses.replace(new.nodes[load], **changes))
        return edit.finish()

    assert "no swap tag" in why_not_deswap(edited(tags=NO_TAGS), order, load)
    assert "no longer in the graph" in why_not_deswap(edited(tags=NodeTags(SwapTag(10**9))), order,
                                                      load)
    relu = out(g, "relu")
    other = edited(tags=NodeTags(SwapTag(relu)))
    assert "does not load a store of" in why_not_deswap(other, order, load)
    assert "one host tensor" in why_not_deswap(edited(args=()), order, load)
    edit = GraphEditor(new)  # pretend a later node writes the original in place
    bnb = node_with_op(g, "native_batch_norm")
    edit.replace_node(dataclasses.replace(new.nodes[bnb], op="aten.relu_.default",
                                          args=new.nodes[bnb].args[:1], kwargs={}))
    writer = edit.finish()
    assert "stale" in why_not_deswap(writer, order, load)
    (loaded,) = new.nodes[load].output_ids()
    edit = GraphEditor(new)
    edit.set_interface(outputs=[*new.outputs, loaded], output_names=[*new.output_names, "out:extra"])
    as_output = edit.finish()
    assert "program output" in why_not_deswap(as_output, order, load)
    with pytest.raises(RuleError, match="not a load"):
        deswap(new, order, store)


def test_inputs_are_untouched(cnn_graph):
    g = cnn_graph
    before = graph_to_json(g)
    swap(g, g.order, out(g, "convolution"), [node_with_op(g, "native_batch_norm_backward")])
    assert graph_to_json(g) == before
