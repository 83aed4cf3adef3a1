"""Weight gradients accumulated by the parts' products (peakcut.fission.accumulate).

The MLP of test_expand with its backward in n parts: each part's weight gradient is an mm
whose result only the merge reads, so the part runs `addmm_(grad, a_k, b_k)` instead of mm and
add_. The step must still give eager's numbers, the measured CPU peak must equal the simulated
one, the program must keep its loops, and the pair it replaces must cost more time (one
elementwise pass over the gradient per part) and no less memory.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.cost import get_cost_model
from peakcut.fission.accumulate import ADDMM_, MM, fusable_pairs, fuse_accumulations
from peakcut.fission.expanded import Expanded
from peakcut.fission.region import RegionExpander
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase, TensorRef
from peakcut.ir.tags import FissionTag
from peakcut.memory import simulate
from peakcut.simulate import simulate_timeline
from tests.fission.test_expand import SPEC, Case, mlp_loss
from tests.tolerance import tolerance

WEIGHTS = 3     # fc1, fc2, fc3


@pytest.fixture(scope="module")
def case() -> Case:
    return Case()


def _weight_gradients(case: Case) -> list[int]:
    """The mm nodes of the backward that make a weight's gradient (2-D, the weight's shape)."""
    shapes = {case.g.tensors[t].shape for t in case.g.inputs if len(case.g.tensors[t].shape) == 2}
    return [v for v in case.nodes(Phase.BACKWARD) if case.g.nodes[v].op == MM
            and case.g.tensors[case.g.nodes[v].outputs[0]].shape in shapes]


def _unfused(case: Case, n: int, monkeypatch: pytest.MonkeyPatch) -> Expanded:
    """The same expansion with the products left unfused (mm, then add_ into the gradient)."""
    with monkeypatch.context() as m:
        m.setattr(RegionExpander, "fuse_accumulations", lambda self: None)
        return case.expand(case.fnode(1, case.nodes(Phase.BACKWARD), n))


def _count(g: Graph, op: str) -> int:
    return sum(1 for node in g.nodes.values() if node.op == op)


@pytest.mark.parametrize("n", [2, 4])
def test_weight_gradients_accumulate_in_their_products(case: Case, n: int,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ex = case.expand(case.fnode(1, case.nodes(Phase.BACKWARD), n))
    g = ex.graph
    fused = [nid for nid in ex.order if g.nodes[nid].op == ADDMM_]
    assert len(fused) == WEIGHTS * n
    for nid in fused:
        node = g.nodes[nid]
        tag = node.tags.get(FissionTag)
        assert tag is not None and tag.role == "part" and tag.of in _weight_gradients(case)
        grad = node.args[0].id          # the preallocated gradient, written in place
        assert grad in case.g.tensors and g.tensors[node.outputs[0]].storage == g.tensors[grad].storage
    for v in _weight_gradients(case):   # each mm's n parts are the fused calls
        assert [g.nodes[c].op for c in ex.copies[v]] == [ADDMM_] * n

    plain = _unfused(case, n, monkeypatch)
    assert _count(plain.graph, ADDMM_) == 0
    assert len(plain.graph.nodes) - len(g.nodes) == WEIGHTS * n      # the absorbed mm calls
    assert simulate(g, ex.order).peak_bytes <= simulate(plain.graph, plain.order).peak_bytes
    h100 = get_cost_model("h100")
    assert (simulate_timeline(g, ex.order, h100).latency_seconds
            < simulate_timeline(plain.graph, plain.order, h100).latency_seconds)

    step = case.check_numbers_and_memory(ex)     # eager's numbers; measured peak == simulated
    assert step.source.count(f"for part in range({n}):") == 1
    assert "addmm_" in step.source and "emitted unrolled" not in step.source


def test_a_product_read_elsewhere_is_not_fused(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge whose part value has another reader keeps its mm: the part's own result is
    then needed."""
    plain = _unfused(case, 2, monkeypatch)
    g = plain.graph
    pairs = fusable_pairs(g, plain.order)
    assert len(pairs) == WEIGHTS * 2
    first = min(pairs, key=plain.order.index)
    part = g.nodes[first].args[1].id
    edit = GraphEditor(g)                           # a second reader of the part's result
    extra = edit.add_op("aten.clone.default", (TensorRef(part),), {}, name="reader",
                        phase=Phase.BACKWARD, module="")
    order = list(plain.order)
    order.insert(order.index(first), extra.id)
    edit.set_order(order)
    assert first not in fusable_pairs(edit.graph, order)
    kept, _ = fuse_accumulations(edit, order, plain.regions)
    assert _count(edit.graph, ADDMM_) == WEIGHTS * 2 - 1 and len(kept) == len(order) - (WEIGHTS * 2 - 1)


def test_a_node_waiting_on_the_product_before_the_merge_keeps_it(
        case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """A node ordered between the mm and its merge that waits on the mm (a later region can
    interleave its nodes there) would wait on a fused call that runs after it: no fusion."""
    plain = _unfused(case, 2, monkeypatch)
    g = plain.graph
    order = list(plain.order)
    merge, product = min(fusable_pairs(g, order).items(), key=lambda mq: order.index(mq[0]))
    pos = {n: i for i, n in enumerate(order)}
    mover = next(n for n in order[pos[merge] + 1:]
                 if all(pos[p] <= pos[product] for p in g.predecessors(n)))
    order.remove(mover)
    order.insert(order.index(merge), mover)
    edit = GraphEditor(g)
    edit.add_control(mover, [product])
    edit.set_order(order)
    check_graph(edit.graph)
    assert merge not in fusable_pairs(edit.graph, order)
    fuse_accumulations(edit, order, plain.regions)
    check_graph(edit.graph)                         # the order still runs every edge
    assert edit.graph.nodes[product].op == MM


def test_a_wide_layer_peaks_lower_by_its_partial_gradient(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 512-wide hidden layer, its backward in 4 parts: unfused, a part's 1 MiB partial
    gradient is live at the peak; fused, the peak is lower by nearly that (what else is live
    there differs by a bias's partial), and the measured CPU peak (allocator events) equals the
    simulated one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8))
    case = Case(model, (torch.randn(512, 64), torch.randint(0, 8, (512,))))
    backward = case.fnode(1, case.nodes(Phase.BACKWARD), 4)
    fused = case.expand(backward)
    with monkeypatch.context() as m:
        m.setattr(RegionExpander, "fuse_accumulations", lambda self: None)
        plain = case.expand(backward)
    partial = 512 * 512 * 4
    saved = simulate(plain.graph, plain.order).peak_bytes - simulate(fused.graph, fused.order).peak_bytes
    assert partial - 4096 <= saved <= partial
    tol = tolerance(torch.float32, reduction=512, steps=2)        # the weight gradients sum 512 rows
    report = peakcut.check_equivalence(case.model, case.batch, mlp_loss, SPEC,
                                       lambda _m: Step(fused.graph, fused.order), steps=2, rtol=tol, atol=tol)
    assert report.ok, str(report)
    measured = peakcut.measure(Step(fused.graph, fused.order), case.model, case.batch,
                               method="cpu-profiler", repeats=1)
    assert measured.peak_bytes == simulate(fused.graph, fused.order).peak_bytes
