"""IR: copying, validation, serialization, registry."""

from __future__ import annotations

import json

import pytest

import peakcut
from peakcut.ir import GraphError, Role, TensorMeta
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.registry import is_opaque, lookup, mutated_arguments
from peakcut.ir.serialize import graph_from_json, graph_to_json
from peakcut.memory import simulate
from tests.conftest import cnn_loss


@pytest.fixture
def graph(small_cnn):
    model, batch = small_cnn
    return peakcut.capture(model, batch, cnn_loss, "adamw")


def test_captured_graph_is_valid(graph):
    check_graph(graph)
    assert graph.summary()["nodes"] == len(graph.nodes)


def test_an_edit_leaves_its_source_alone(graph):
    edit = GraphEditor(graph)
    victim = next(n for n in graph.order if not graph.users(graph.nodes[n].outputs[0] or -1)
                  and graph.nodes[n].outputs[0] not in graph.outputs and graph.nodes[n].outputs[0] is not None
                  and not graph.mutated_tensors(n))
    edit.remove_node(victim)
    variant = edit.finish()
    assert victim in graph.nodes and victim not in variant.nodes
    assert len(graph.order) == len(variant.order) + 1


def test_graphs_are_read_only(graph):
    nid = graph.order[0]
    with pytest.raises(TypeError):
        graph.nodes[nid] = graph.nodes[nid]   # type: ignore[index]
    with pytest.raises(TypeError):
        del graph.tensors[graph.inputs[0]]    # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="GraphEditor"):
        graph.order = list(graph.order)       # type: ignore[misc]
    with pytest.raises(AttributeError, match="GraphEditor"):
        graph.control = {}                    # type: ignore[misc]


def test_roles(graph):
    roles = {graph.tensors[t].role for t in graph.inputs}
    assert roles == {Role.PARAM, Role.BUFFER, Role.OPT_STATE, Role.INPUT}
    assert all(not graph.tensors[t].role.caller_held for n in graph.nodes.values() for t in n.output_ids())


def test_check_rejects_order_violating_dependencies(graph):
    bad = graph.with_order(reversed(graph.order))
    with pytest.raises(GraphError, match="before"):
        check_graph(bad)
def test_check_rejects_wrong_role(graph):
    edit = GraphEditor(graph)
    t = graph.tensors[graph.inputs[0]]
    edit.set_tensor(TensorMeta(t.id, t.shape, t.stride, t.dtype, t.storage, t.storage_offset, Role.ACTIVATION, t.name))
    bad = edit.finish()
    with pytest.raises(GraphError, match="role activation but is a program input"):
        check_graph(bad)
def test_check_rejects_wrong_shape(graph):
    edit = GraphEditor(graph)
    nid = next(n for n in graph.order if graph.nodes[n].op == "aten.addmm.default")
    t = graph.tensors[graph.nodes[nid].outputs[0]]
    edit.set_tensor(TensorMeta(t.id, (t.shape[0], t.shape[1] + 1), t.stride, t.dtype, t.storage,
                               t.storage_offset, t.role, t.name))
    bad = edit.finish()
    with pytest.raises(GraphError, match="addmm"):
        check_graph(bad)
def test_check_rejects_dangling_reference(graph):
    edit = GraphEditor(graph)
    nid = graph.order[-1]
    n = graph.nodes[nid]
    edit.replace_node(Node(n.id, n.op, (TensorRef(10**9), *n.args[1:]), n.kwargs, n.outputs, n.multi_output,
                           n.module, n.phase, n.name))
    bad = edit.finish()
    with pytest.raises(GraphError, match="unknown tensor"):
        check_graph(bad)
def test_json_round_trip(graph):
    again = graph_from_json(graph_to_json(graph))
    assert graph_to_json(again) == graph_to_json(graph)
    assert simulate(again).peak_bytes == simulate(graph).peak_bytes


def test_json_rejects_garbage():
    with pytest.raises(GraphError, match="invalid JSON"):
        graph_from_json("{not json")
    with pytest.raises(GraphError, match="missing format tag"):
        graph_from_json(json.dumps({"hello": 1}))


def test_json_rejects_other_version(graph):
    doc = json.loads(graph_to_json(graph))
    doc["version"] = 999
    with pytest.raises(GraphError, match="version 999 is not supported"):
        graph_from_json(json.dumps(doc))


def test_json_rejects_corrupt_fields(graph):
    doc = json.loads(graph_to_json(graph))
    del doc["nodes"][3]["op"]
    with pytest.raises(GraphError, match="corrupt peakcut graph"):
        graph_from_json(json.dumps(doc))
    doc = json.loads(graph_to_json(graph))
    doc["order"] = doc["order"][:-1]
    with pytest.raises(GraphError, match="permutation"):
        graph_from_json(json.dumps(doc))


def test_registry_facts():
    assert lookup("aten.mm.default").kind.value == "matmul"
    assert lookup("aten.native_dropout.default").random
    assert is_opaque("aten.definitely_not_an_op.default")
    assert mutated_arguments("aten.add_.Tensor") == {"self"}
    assert {"running_mean", "running_var"} <= mutated_arguments("aten.native_batch_norm.default")


def test_registry_flops_and_bytes():
    import torch

    from peakcut.ir.registry import bytes_moved, flops

    a, b = torch.empty(8, 16, device="meta"), torch.empty(16, 4, device="meta")
    out = torch.empty(8, 4, device="meta")
    assert flops("aten.mm.default", (a, b), {}, [out]) == 2 * 8 * 16 * 4
    assert flops("aten.relu.default", (a,), {}, [a]) == 8 * 16
    assert flops("aten.view.default", (a, [128]), {}, [a]) == 0
    assert bytes_moved([a, b], [out]) == (8 * 16 + 16 * 4 + 8 * 4) * 4
    q, lse = torch.empty(2, 4, 16, 8, device="meta"), torch.empty(2, 4, 16, device="meta")
    cpu_attention = "aten._scaled_dot_product_flash_attention_for_cpu.default"   # not in torch's counter
    assert flops(cpu_attention, (q, q, q), {}, [q, lse]) == 2 * (2 * 2 * 4 * 16 * 16 * 8)   # QK^T and PV
    assert flops(cpu_attention.replace(".default", "_backward.default"), (q, q, q, q, q, lse, 0.0, False),
                 {}, [q, q, q]) == 5 * (2 * 2 * 4 * 16 * 16 * 8)                      # five matmuls
