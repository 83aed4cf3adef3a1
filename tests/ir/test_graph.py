"""IR: copying, validation, serialization, registry."""

from __future__ import annotations

import json

import pytest

import peakcut
from peakcut.ir import GraphError, Role, TensorMeta
from peakcut.ir.node import Node, TensorRef
from peakcut.ir.registry import is_opaque, lookup, mutated_arguments
from peakcut.memory import simulate
from tests.conftest import cnn_loss


@pytest.fixture
def graph(small_cnn):
    model, batch = small_cnn
    return peakcut.capture(model, batch, cnn_loss, "adamw")


def test_captured_graph_is_valid(graph):
    graph.check()
    assert graph.summary()["nodes"] == len(graph.nodes)


def test_copy_is_independent(graph):
    variant = graph.copy()
    victim = next(n for n in variant.order if not variant.users(variant.nodes[n].outputs[0] or -1)
                  and variant.nodes[n].outputs[0] not in variant.outputs and variant.nodes[n].outputs[0] is not None
                  and not variant.mutated_tensors(n))
    variant.remove_node(victim)
    assert victim in graph.nodes and victim not in variant.nodes
    assert len(graph.order) == len(variant.order) + 1


def test_roles(graph):
    roles = {graph.tensors[t].role for t in graph.inputs}
    assert roles == {Role.PARAM, Role.BUFFER, Role.OPT_STATE, Role.INPUT}
    assert all(not graph.tensors[t].role.caller_held for n in graph.nodes.values() for t in n.output_ids())


def test_check_rejects_order_violating_dependencies(graph):
    bad = graph.copy()
    bad.order = list(reversed(bad.order))
    with pytest.raises(GraphError, match="before"):
        bad.check()


def test_check_rejects_wrong_role(graph):
    bad = graph.copy()
    t = bad.tensors[bad.inputs[0]]
    bad.tensors[t.id] = TensorMeta(t.id, t.shape, t.stride, t.dtype, t.storage, t.storage_offset, Role.ACTIVATION, t.name)
    with pytest.raises(GraphError, match="role activation but is a program input"):
        bad.check()


def test_check_rejects_wrong_shape(graph):
    bad = graph.copy()
    nid = next(n for n in bad.order if bad.nodes[n].op == "aten.addmm.default")
    t = bad.tensors[bad.nodes[nid].outputs[0]]
    bad.tensors[t.id] = TensorMeta(t.id, (t.shape[0], t.shape[1] + 1), t.stride, t.dtype, t.storage,
                                   t.storage_offset, t.role, t.name)
    with pytest.raises(GraphError, match="addmm"):
        bad.check()


def test_check_rejects_dangling_reference(graph):
    bad = graph.copy()
    nid = bad.order[-1]
    n = bad.nodes[nid]
    bad.nodes[nid] = Node(n.id, n.op, (TensorRef(10**9), *n.args[1:]), n.kwargs, n.outputs, n.multi_output,
                          n.module, n.phase, n.name)
    bad._invalidate()
    with pytest.raises(GraphError, match="unknown tensor"):
        bad.check()


def test_json_round_trip(graph):
    again = peakcut.Graph.from_json(graph.to_json())
    assert again.to_json() == graph.to_json()
    assert simulate(again).peak_bytes == simulate(graph).peak_bytes


def test_json_rejects_garbage():
    with pytest.raises(GraphError, match="invalid JSON"):
        peakcut.Graph.from_json("{not json")
    with pytest.raises(GraphError, match="missing format tag"):
        peakcut.Graph.from_json(json.dumps({"hello": 1}))


def test_json_rejects_other_version(graph):
    doc = json.loads(graph.to_json())
    doc["version"] = 999
    with pytest.raises(GraphError, match="version 999 is not supported"):
        peakcut.Graph.from_json(json.dumps(doc))


def test_json_rejects_corrupt_fields(graph):
    doc = json.loads(graph.to_json())
    del doc["nodes"][3]["op"]
    with pytest.raises(GraphError, match="corrupt peakcut graph"):
        peakcut.Graph.from_json(json.dumps(doc))
    doc = json.loads(graph.to_json())
    doc["order"] = doc["order"][:-1]
    with pytest.raises(GraphError, match="permutation"):
        peakcut.Graph.from_json(json.dumps(doc))


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
