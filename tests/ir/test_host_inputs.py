"""Program inputs kept in host memory between steps: a load brings them in, a writeback puts the
new value back, and the house (check, liveness, cost, streams, binding) treats them as host
memory."""

from __future__ import annotations

import pytest
import torch

from peakcut.codegen.update_inputs import StepBindingError, _check_like
from peakcut.cost.calls import swap_transfer
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.ops import LOAD_OP, WRITEBACK_OP
from peakcut.ir.serialize import graph_from_json, graph_to_json
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.memory import simulate
from peakcut.simulate import simulate_timeline
from peakcut.simulate.streams import COMPUTE, D2H, H2D, node_stream
from tests.simulate.helpers import FakeCost, GraphBuilder, constant

NUMEL = 1024


def _state_graph(offloaded: bool) -> tuple[Graph, int]:
    """x (an input) -> e = exp(x) -> out = sum(e); offloaded: x is read through a load and e is
    written back into it. Returns (graph, x)."""
    b = GraphBuilder()
    x = b.input("x", (NUMEL,))
    if not offloaded:
        e = b.op("aten.exp.default", x, shape=(NUMEL,), name="e")
        b.output(b.op("aten.sum.default", e, shape=(), name="out"))
        return b.g, x
    d = b.op(LOAD_OP, x, shape=(NUMEL,), name="x_device")
    e = b.op("aten.exp.default", d, shape=(NUMEL,), name="e")
    b.output(b.op("aten.sum.default", e, shape=(), name="out"))
    edit = GraphEditor(b.g)
    load = edit.graph.producer(d)
    assert load is not None
    edit.replace_node(Node(load, LOAD_OP, (TensorRef(x),), {"device": torch.device("cpu")}, (d,),
                           name="load_x"))
    back = edit.new_id()
    edit.add_node(Node(back, WRITEBACK_OP, (TensorRef(x), TensorRef(e)), {}, (None,),
                       phase=Phase.OPTIMIZER, name="writeback_x"))
    edit.insert_in_order(len(edit.graph.order), [back])
    return edit.finish(), x


def test_a_loaded_input_is_kept_in_host_memory() -> None:
    g, x = _state_graph(offloaded=True)
    check_graph(g)
    assert g.host_inputs() == [x]
    assert g.tensors[x].storage in g.host_storages()
    assert graph_from_json(graph_to_json(g)).host_inputs() == [x]   # derived: nothing new to save


def test_a_host_input_takes_no_device_memory() -> None:
    plain, _ = _state_graph(offloaded=False)
    offloaded, _ = _state_graph(offloaded=True)
    assert simulate(plain, plain.order).baseline_bytes == NUMEL * 4
    profile = simulate(offloaded, offloaded.order)
    assert profile.baseline_bytes == 0
    # load: the device copy; exp: copy + e; sum: e + out; writeback: reads e (out lives on)
    assert profile.timeline.tolist() == [NUMEL * 4, 2 * NUMEL * 4, NUMEL * 4 + 4, NUMEL * 4 + 4]
    assert simulate(plain, plain.order).timeline.tolist() == [2 * NUMEL * 4, 2 * NUMEL * 4 + 4]


def test_removing_the_load_brings_the_input_back_to_the_device() -> None:
    g, x = _state_graph(offloaded=True)
    assert g.host_inputs() == [x]
    edit = GraphEditor(g)
    edit.remove_nodes([n for n in g.order if g.nodes[n].op in (LOAD_OP, WRITEBACK_OP)],
                      keep_tensors=[])
    assert edit.finish().host_inputs() == []


def test_check_refuses_other_readers_and_device_loads() -> None:
    g, x = _state_graph(offloaded=True)
    edit = GraphEditor(g)
    reader = edit.new_id()
    out = TensorMeta(edit.new_id(), (NUMEL,), (1,), "float32", edit.add_storage(NUMEL * 4), 0,
                     Role.ACTIVATION, "neg")
    edit.add_node(Node(reader, "aten.neg.default", (TensorRef(x),), {}, (out.id,), name="neg"), [out])
    edit.insert_in_order(0, [reader])
    with pytest.raises(GraphError, match="lives in host memory: only loads and nodes on the host read it"):
        check_graph(edit.finish())

    plain, y = _state_graph(offloaded=False)
    edit = GraphEditor(plain)
    back = edit.new_id()
    e = plain.inputs[0]
    edit.add_node(Node(back, WRITEBACK_OP, (TensorRef(y), TensorRef(e)), {}, (None,),
                       phase=Phase.OPTIMIZER, name="writeback"))
    edit.insert_in_order(len(plain.order), [back])
    with pytest.raises(GraphError, match="program input kept in host memory"):
        check_graph(edit.finish())


def test_a_writeback_is_a_device_to_host_copy_of_its_source() -> None:
    g, _ = _state_graph(offloaded=True)
    back = next(n for n in g.order if g.nodes[n].op == WRITEBACK_OP)
    load = next(n for n in g.order if g.nodes[n].op == LOAD_OP)
    assert swap_transfer(g, back) == (NUMEL * 4, "d2h")
    assert swap_transfer(g, load) == (NUMEL * 4, "h2d")
    assert node_stream(WRITEBACK_OP, overlap_copies=True) == D2H
    assert node_stream(LOAD_OP, overlap_copies=True) == H2D
    assert node_stream(WRITEBACK_OP, overlap_copies=False) != D2H


def test_the_binding_accepts_host_state_only_where_the_plan_keeps_it() -> None:
    p = torch.empty(4, device="meta")
    on_host = torch.zeros(4)
    _check_like("w", "exp_avg", on_host, p, p.device, host_ok=True)
    with pytest.raises(StepBindingError, match="on cpu, the parameter is .* the step runs on meta"):
        _check_like("w", "exp_avg", on_host, p, p.device)


def test_a_host_inputs_copies_are_timed_on_the_copy_streams_where_copies_overlap() -> None:
    """The code of a load of a program input and of a writeback copies on the copy streams on
    CUDA (codegen/input_copy_code.py) and on the one stream on CPU; the timeline times them so."""
    g, _ = _state_graph(offloaded=True)
    copies = [n for n in g.order if g.nodes[n].op in (LOAD_OP, WRITEBACK_OP)]
    overlapped = simulate_timeline(g, g.order, FakeCost(constant(1.0), copy=3.0), None)
    assert [overlapped.stream_of(n) for n in copies] == [H2D, D2H]
    assert overlapped.exposed_copy_seconds == 3.0          # exp waits for the load; nothing waits for the writeback
    assert overlapped.latency_seconds == 3.0 + 1.0 + 1.0 + 3.0
    inline = simulate_timeline(g, g.order, FakeCost(constant(1.0), overlap_copies=False, copy=3.0), None)
    assert [inline.stream_of(n) for n in copies] == [COMPUTE, COMPUTE]
    assert inline.exposed_copy_seconds == 6.0
