"""The graph editor: ids, nodes made by a fake run with the real storage identity, the order,
and the caches it keeps (every kept cache must say what a graph rebuilding it would)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch

import peakcut
from peakcut.ir import Graph, GraphError
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor, rewired, splice
from peakcut.ir.infer import InferenceError
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.ops import LOAD_OP, STORE_OP
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.rules import RULES
from tests.conftest import cnn_loss


@pytest.fixture
def graph(small_cnn) -> Graph:
    """A captured step with a swap (host storages) and a recompute applied."""
    model, batch = small_cnn
    g = peakcut.capture(model, batch, cnn_loss, "adamw")
    order = list(g.order)
    for kind in ("swap", "remat"):
        c = RULES.hotspot_candidates(g, order, limit=1, kinds=(kind,))[0]
        rw = c.apply(g, order)
        g, order = rw.graph, rw.order
    return g


def warm(g: Graph) -> None:
    """Build every cached query of g."""
    g.producer_map()
    g.users(0)
    g.successors(g.order[0])
    g.storage_writers(0)
    g.storage_owner_of(0)
    g.is_host_storage(0)
    g.next_id()


def assert_caches_true(g: Graph) -> None:
    """Every cached query of g says what a copy of g (no caches) computes afresh."""
    fresh = g.copy()
    assert g.producer_map() == fresh.producer_map()
    assert all(g.users(t) == fresh.users(t) for t in g.tensors)
    assert all(g.successors(n) == fresh.successors(n) for n in g.nodes)
    assert all(g.storage_writers(s) == fresh.storage_writers(s) for s in g.storages)
    assert g.storage_owner() == fresh.storage_owner()
    assert g.host_storages() == fresh.host_storages()
    assert g.next_id() == max([*g.nodes, *g.tensors, *g.storages, 0]) + 1


def edited(g: Graph, change: Callable[[GraphEditor], None]) -> Graph:
    """g (caches warm) edited by `change`; g itself must not change."""
    warm(g)
    before = g.copy()
    edit = GraphEditor(g)
    change(edit)
    new = edit.finish()
    assert g == before
    assert_caches_true(g)
    assert_caches_true(new)
    return new


def unread_output(g: Graph) -> int:
    """A node whose outputs nobody reads and that writes nothing."""
    return next(n for n in g.order if g.nodes[n].output_tuple and not g.mutated_tensors(n)
                and not any(g.users(t) or t in g.outputs for t in g.nodes[n].output_tuple))


def test_every_edit_keeps_only_true_caches(graph):
    g = graph
    relu = next(n for n in g.order if g.nodes[n].op == "aten.relu.default")
    (out,) = g.nodes[relu].output_tuple
    meta = g.tensors[out]

    def add_neg(edit: GraphEditor) -> None:
        node = edit.add_op("aten.neg.default", (TensorRef(out),), {}, name="neg", phase=Phase.FORWARD,
                           module="")
        edit.insert_in_order(g.order.index(relu) + 1, [node.id])

    g1 = edited(g, add_neg)
    neg = max(g1.nodes)
    reader = g.users(out)[0]
    g2 = edited(g1, lambda e: e.rewire(reader, {out: g1.nodes[neg].outputs[0]}))
    g3 = edited(g2, lambda e: e.set_control(neg, (reader,)) or e.set_control(neg, ()))
    store = next(n for n in g.order if g.nodes[n].op == STORE_OP)
    (host,) = g.nodes[store].output_tuple
    edited(g3, lambda e: e.set_tensor(TensorMeta(
        host, meta.shape, meta.stride, meta.dtype, meta.storage, 0, Role.ACTIVATION, "moved")))
    writer = next(n for n in reversed(g.order) if g.mutated_tensors(n))   # an optimizer update
    assert len(g.storage_writers(g.tensors[g.mutated_tensors(writer)[0]].storage)) > 1
    edited(g3, lambda e: e.set_order([writer, *(n for n in g3.order if n != writer)]))
    edited(g3, lambda e: e.remove_nodes([writer], keep_tensors=g3.nodes[writer].output_tuple))
    edited(g3, lambda e: e.replace_node(Node(writer, "aten.zeros.default", ([1],), {},
                                             g3.nodes[writer].outputs)))
    edited(g3, lambda e: e.remove_node(unread_output(g3)))
    load = next(n for n in g.order if g.nodes[n].op == LOAD_OP)
    edited(g3, lambda e: e.remove_nodes([load], keep_tensors=()))
    edited(g3, lambda e: e.add_storage(64) and e.remove_unused_storages())


def test_random_edits_keep_the_caches_true(graph):
    rng = random.Random(0)
    g = graph
    for _ in range(12):
        nid = rng.choice(g.order)
        node = g.nodes[nid]

        def change(edit: GraphEditor, node: Node = node) -> None:
            kind = rng.randrange(4)
            if kind == 0 and node.output_tuple:
                new = edit.add_op("aten.alias.default", (TensorRef(node.output_tuple[0]),), {},
                                  name="alias", phase=node.phase, module=node.module)
                edit.insert_in_order(edit.graph.order.index(node.id) + 1, [new.id])
            elif kind == 1:
                edit.replace_node(rewired(node, {}))
            elif kind == 2:
                edit.add_control(node.id, [edit.graph.order[0]] if edit.graph.order[0] != node.id else [])
            else:
                edit.set_order(edit.graph.order)

        g = edited(g, change)
    check_graph(g)
def test_ids_are_fresh_and_in_call_order(graph):
    edit = GraphEditor(graph)
    first = graph.next_id()
    assert [edit.new_id(), edit.add_storage(8), edit.next_id] == [first, first + 1, first + 2]
    assert GraphEditor(graph, next_id=10**6).new_id() == 10**6


def test_add_op_takes_the_real_storage_of_views_and_in_place_results(graph):
    g = graph
    relu = next(n for n in g.order if g.nodes[n].op == "aten.relu.default")
    (x,) = g.nodes[relu].output_tuple
    meta = g.tensors[x]
    edit = GraphEditor(g)
    start = edit.next_id
    view = edit.add_op("aten.t.default", (TensorRef(x),), {}, name="xt", phase=Phase.FORWARD,
                       module="") if len(meta.shape) == 2 else \
        edit.add_op("aten.permute.default", (TensorRef(x), list(reversed(range(len(meta.shape))))), {},
                    name="xt", phase=Phase.FORWARD, module="")
    (vt,) = view.output_tuple
    assert (view.id, vt) == (start, start + 1)           # a view: no storage of its own
    assert edit.graph.tensors[vt].storage == meta.storage
    assert edit.graph.tensors[vt].shape == tuple(reversed(meta.shape))
    inplace = edit.add_op("aten.mul_.Scalar", (TensorRef(x), 2.0), {}, name="x2", phase=Phase.FORWARD,
                          module="")
    assert edit.graph.tensors[inplace.outputs[0]].storage == meta.storage
    fresh = edit.add_op("aten.neg.default", (TensorRef(vt),), {}, name="n", phase=Phase.FORWARD,
                        module="")
    nid, storage, tid = fresh.id, fresh.id + 1, fresh.outputs[0]
    assert tid == fresh.id + 2 and edit.graph.tensors[tid].storage == storage
    assert edit.graph.storages[storage] == meta.nbytes
    first = edit.add_op("aten.neg.default", (TensorRef(vt),), {}, name="m", phase=Phase.FORWARD,
                        module="", tensor_ids_first=True)
    assert edit.graph.tensors[first.outputs[0]].storage == first.outputs[0] + 1
    g2 = edit.graph
    assert g2.next_id() == max([*g2.nodes, *g2.tensors, *g2.storages]) + 1 == first.outputs[0] + 2
    with pytest.raises(InferenceError):
        edit.add_op("aten.mm.default", (TensorRef(x), TensorRef(x)), {}, name="bad",
                    phase=Phase.FORWARD, module="")
    del nid


def test_add_op_can_stand_for_an_existing_tensor(graph):
    g = graph
    relu = next(n for n in g.order if g.nodes[n].op == "aten.relu.default")
    (x,) = g.nodes[relu].output_tuple
    meta = g.tensors[x]
    edit = GraphEditor(g)
    alloc = edit.add_op("aten.empty_strided.default", (list(meta.shape), list(meta.stride)),
                        {"dtype": meta.torch_dtype, "device": torch.device("cpu")}, name="alloc",
                        phase=Phase.FORWARD, module="", outputs=[x])
    assert alloc.outputs == (x,) and edit.graph.producer(x) == alloc.id
    with pytest.raises(GraphError, match="cannot stand for"):
        edit.add_op("aten.zeros.default", ([1],), {"dtype": meta.torch_dtype}, name="bad",
                    phase=Phase.FORWARD, module="", outputs=[x])
    seen = []

    def refuse(layouts):
        seen.append(layouts)
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        edit.add_op("aten.neg.default", (TensorRef(x),), {}, name="n", phase=Phase.FORWARD, module="",
                    check=refuse)
    assert seen and seen[0][0][:3] == (meta.shape, meta.stride, meta.dtype)


def test_replace_keeps_outputs_and_finish_ends_the_edit(graph):
    nid = graph.order[-1]
    node = graph.nodes[nid]
    edit = GraphEditor(graph)
    with pytest.raises(GraphError, match="outputs would change"):
        edit.replace_node(Node(nid, node.op, node.args, node.kwargs, (10**9,)))
    with pytest.raises(GraphError, match="no such node"):
        edit.replace_node(Node(10**9, node.op, node.args, node.kwargs, ()))
    edit.finish()
    with pytest.raises(GraphError, match="finished"):
        edit.set_order(graph.order)


def test_splice():
    assert splice([1, 2, 3], 1, [7, 8]) == [1, 7, 8, 2, 3]
    assert splice([1, 2, 3], 3, [7]) == [1, 2, 3, 7]
