"""Fission expansion (peakcut.fission.expand) and its loops (codegen.fission) on a small MLP
with AdamW, split along the batch with hand-made F-Trees.

The MLP's forward + backward cannot be one valid F-Trans: nll_loss_backward reads the total
weight nll_loss_forward computes over the whole batch (trans.why_not_valid says so). So the
batch component is split as two regions: the forward with the loss (the loss merges as a mean
nll_loss: per-part sums over the summed total weight) and the backward (weight gradients
summed over the parts). Every expansion must give eager's numbers, and the peak measured on
CPU (allocator events) must equal the simulated peak of the expanded graph exactly.
"""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.cost import get_cost_model
from peakcut.fission.build import batch_component
from peakcut.fission.dgraph import Component, DGraph, build_dgraph
from peakcut.fission.expand import expand
from peakcut.fission.expanded import Expanded, FissionError
from peakcut.fission.ftree import FNode, FTree
from peakcut.fission.trans import why_not_valid
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node, Phase, TensorRef
from peakcut.ir.tags import FissionTag, NodeTags
from peakcut.ir.tensor import Role, TensorMeta
from peakcut.memory import simulate
from peakcut.simulate import simulate_timeline
from tests.transform.conftest import random_topological_order

SPEC = peakcut.AdamW(lr=1e-3, weight_decay=1e-2)
BATCH = 8


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def mlp_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


class ScaledByMean(nn.Module):
    """h * h.mean(0): the product reads a mean over the batch, a partial result per part."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h * h.mean(0, keepdim=True)


class Case:
    """The MLP (or a given classifier and its (x, y) batch), the captured step, its D-Graph
    and batch component."""

    def __init__(self, model: nn.Module | None = None,
                 batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        torch.manual_seed(0)
        self.model = MLP() if model is None else model
        self.batch = (torch.randn(BATCH, 8), torch.randint(0, 4, (BATCH,))) if batch is None else batch
        self.g: Graph = peakcut.capture(self.model, self.batch, mlp_loss, SPEC, keep_grads=True)
        self.dgraph: DGraph = build_dgraph(self.g)
        comp = batch_component(self.g, self.dgraph)[0]
        assert comp is not None and comp.length == len(self.batch[0])
        self.comp: Component = comp

    def nodes(self, *phases: Phase, views: bool = True) -> list[int]:
        """Nodes of the batch component in these phases (views: keep detach nodes)."""
        return [v for v in self.g.order if v in self.comp.labels
                and self.g.nodes[v].phase in phases
                and (views or self.g.nodes[v].op != "aten.detach.default")]

    def fnode(self, k: int, nodes: list[int], n: int) -> FNode:
        labels = {v: self.comp.labels[v][0] for v in nodes}
        return FNode(id=k, nodes=frozenset(nodes), labels=labels,
                     length=self.comp.length, component=self.comp.id, dominator=nodes[0],
                     score=0.0, heat=0, level=1, n=n)

    def expand(self, *fnodes: FNode) -> Expanded:
        return expand(self.g, self.g.order, FTree(tuple(fnodes)), self.dgraph)

    def check_numbers_and_memory(self, ex: Expanded, order: list[int] | None = None) -> Step:
        order = ex.order if order is None else order
        report = peakcut.check_equivalence(self.model, self.batch, mlp_loss, SPEC,
                                           lambda _m: Step(ex.graph, order), steps=2,
                                           rtol=1e-5, atol=1e-6)
        assert report.ok, str(report)
        assert {"loss", "grad", "param", "state"} <= report.kinds()
        step = Step(ex.graph, order)
        measured = peakcut.measure(step, self.model, self.batch, method="cpu-profiler", repeats=1)
        assert measured.peak_bytes == simulate(ex.graph, order).peak_bytes
        return step


def role(g: Graph, nid: int) -> str | None:
    """The fission role of a node (None for a node the expansion did not make)."""
    tag = g.nodes[nid].tags.get(FissionTag)
    return tag.role if tag is not None else None


@pytest.fixture(scope="module")
def case() -> Case:
    return Case()


def test_the_two_regions_are_valid_f_trans(case: Case) -> None:
    fwd = case.nodes(Phase.FORWARD, Phase.LOSS, views=False)
    bwd = case.nodes(Phase.BACKWARD)
    both = case.nodes(Phase.FORWARD, Phase.LOSS, Phase.BACKWARD, views=False)
    assert why_not_valid(case.g, case.dgraph, fwd, case.comp, n=4) is None
    assert why_not_valid(case.g, case.dgraph, bwd, case.comp, n=4) is None
    reason = why_not_valid(case.g, case.dgraph, both, case.comp)
    assert "nll_loss_forward -> nll_loss_backward" in reason


@pytest.mark.parametrize("n", [2, 4])
def test_forward_and_backward_in_n_parts(case: Case, n: int) -> None:
    fwd = case.nodes(Phase.FORWARD, Phase.LOSS, views=False)
    bwd = case.nodes(Phase.BACKWARD)
    ex = case.expand(case.fnode(0, fwd, n), case.fnode(1, bwd, n))
    g = ex.graph
    check_graph(g)
    assert g.order == ex.order
    # every node of both regions runs n times, on 1/n of the batch
    assert set(ex.copies) == set(fwd) | set(bwd)
    assert all(len(c) == n for c in ex.copies.values())
    first_mm = next(v for v in fwd if case.g.nodes[v].op == "aten.addmm.default")
    for k, copy in enumerate(ex.copies[first_mm]):
        tag = g.nodes[copy].tags.get(FissionTag)
        assert g.nodes[copy].tags == NodeTags(FissionTag(0, "part", ((0, k),), k, n, first_mm,
                                                                 tag.label, case.comp.id))
        assert g.tensors[g.nodes[copy].outputs[0]].shape == (BATCH // n, 32)
    # slices are views of the whole tensor; preallocations output the original tensors
    slices = [nid for nid in g.nodes if role(g, nid) == "slice"]
    assert slices
    for nid in slices:
        (src,), (out,) = g.nodes[nid].input_ids(), g.nodes[nid].outputs
        assert g.tensors[out].storage == g.tensors[src].storage
    allocated = [t for nid in g.nodes if role(g, nid) == "alloc"
                 for t in g.nodes[nid].output_ids() if t in case.g.tensors]
    assert allocated
    for t in allocated:
        assert g.tensors[t] == case.g.tensors[t]
        assert g.storages[g.tensors[t].storage] == case.g.storages[case.g.tensors[t].storage]
    assert g.outputs == case.g.outputs
    # latency: the cost model sees the parts
    timeline = simulate_timeline(g, ex.order, get_cost_model("cpu"))
    assert timeline.latency_seconds > 0 and len(timeline.order) == len(ex.order)

    step = case.check_numbers_and_memory(ex)
    assert step.source.count(f"for part in range({n}):") == 2
    assert "# fission region 0:" in step.source and "# fission region 1:" in step.source
    assert "emitted unrolled" not in step.source


def test_nested_regions_give_nested_loops(case: Case) -> None:
    bwd = case.nodes(Phase.BACKWARD)
    start = next(i for i, v in enumerate(bwd) if case.g.nodes[v].module == "fc2")
    inner = bwd[start:]        # the backward of fc2 and fc1: a convex tail of the backward
    ex = case.expand(case.fnode(0, bwd, 2), case.fnode(1, inner, 2))
    assert all(len(ex.copies[v]) == 4 for v in inner)
    assert all(len(ex.copies[v]) == 2 for v in set(bwd) - set(inner))
    paths = {ex.graph.nodes[c].tags.get(FissionTag).path for v in inner for c in ex.copies[v]}
    assert paths == {((0, a), (1, b)) for a in range(2) for b in range(2)}
    step = case.check_numbers_and_memory(ex)
    assert "for part in range(2):" in step.source
    assert "    for part2 in range(2):" in step.source


def test_views_leaving_a_region_run_whole_on_the_merged_tensor(case: Case) -> None:
    """The forward hands detach views of its activations to the backward: the detach nodes
    stay (same ids) and run after the parts on the merged activations."""
    fwd = case.nodes(Phase.FORWARD, Phase.LOSS)
    detaches = [v for v in fwd if case.g.nodes[v].op == "aten.detach.default"]
    assert detaches
    ex = case.expand(case.fnode(0, fwd, 4))
    for v in detaches:
        assert ex.graph.nodes[v] == case.g.nodes[v]
    (region,) = ex.regions
    assert set(region.replayed) == set(detaches)
    case.check_numbers_and_memory(ex)


def test_parts_out_of_order_are_emitted_unrolled(case: Case) -> None:
    """A part that starts before the previous one ends cannot be a loop: the region is
    emitted unrolled (saying so) and still runs the order exactly."""
    ex = case.expand(case.fnode(0, case.nodes(Phase.BACKWARD), 2))
    (region,) = ex.regions
    first_of_part1 = region.parts[1][0]
    assert role(ex.graph, first_of_part1) == "slice"
    order = [nid for nid in ex.order if nid != first_of_part1]
    order.insert(order.index(region.parts[0][0]) + 1, first_of_part1)
    step = case.check_numbers_and_memory(ex, order)
    assert "emitted unrolled: its parts are interleaved in this order (part 0 after part 1)" \
        in step.source
    assert "for part in range(" not in step.source


def test_a_part_tensor_read_after_its_loop_unrolls_the_region(case: Case) -> None:
    """A node after the parts reading a tensor of the last part (not something expand makes,
    but a later rewrite could): a loop would not define that variable, so the region is
    emitted unrolled."""
    ex = case.expand(case.fnode(0, case.nodes(Phase.BACKWARD), 2))
    g = ex.graph
    (region,) = ex.regions
    last_copy = next(nid for nid in reversed(region.parts[1]) if role(g, nid) == "part")
    part_tensor = g.nodes[last_copy].outputs[0]
    meta = g.tensors[part_tensor]
    edit = GraphEditor(g)
    nid, tid = edit.new_id(), edit.new_id()
    storage = edit.add_storage(g.storages[meta.storage])
    edit.add_node(Node(id=nid, op="aten.neg.default", args=(TensorRef(part_tensor),), kwargs={},
                       outputs=(tid,), phase=Phase.BACKWARD, name="late_reader"),
                  [TensorMeta(tid, meta.shape, meta.stride, meta.dtype, storage, 0, Role.ACTIVATION,
                              "late")])
    order = list(ex.order)
    order.insert(order.index(region.parts[1][-1]) + 1, nid)
    edit.set_order(order)
    g = edit.finish()
    check_graph(g)
    step = case.check_numbers_and_memory(Expanded(g, order, ex.copies, ex.regions))
    assert "emitted unrolled" in step.source and "outside the loop iteration" in step.source


def test_other_orders_run_exactly_with_loops_where_they_still_hold(case: Case) -> None:
    """Reordered expanded graphs (a scheduler's doing): regions whose parts still run alike
    stay loops, the others are unrolled; numbers and peak always match the order."""
    bwd = case.nodes(Phase.BACKWARD)
    start = next(i for i, v in enumerate(bwd) if case.g.nodes[v].module == "fc2")
    fwd = case.nodes(Phase.FORWARD, Phase.LOSS)
    ex = case.expand(case.fnode(0, bwd, 2), case.fnode(1, bwd[start:], 2), case.fnode(2, fwd, 4))
    g = ex.graph
    rng = random.Random(0)
    orders = [random_topological_order(g, seed) for seed in range(2)]
    for _ in range(4):
        order = list(ex.order)
        while order == ex.order:   # swap one adjacent independent pair
            i = rng.randrange(len(order) - 1)
            if order[i] not in g.predecessors(order[i + 1]):
                order[i], order[i + 1] = order[i + 1], order[i]
        orders.append(order)
    loops = []
    for order in orders:
        report = peakcut.check_equivalence(case.model, case.batch, mlp_loss, SPEC,
                                           lambda _m, order=order: Step(g, order), steps=1)
        assert report.ok, str(report)
        step = Step(g, order)
        measured = peakcut.measure(step, case.model, case.batch, method="cpu-profiler", repeats=1)
        assert measured.peak_bytes == simulate(g, order).peak_bytes
        loops.append(step.source.count("in range("))
    assert loops[:2] == [0, 0] and max(loops[2:]) > 0


def test_what_cannot_be_exact_is_refused(case: Case) -> None:
    fwd = case.nodes(Phase.FORWARD, Phase.LOSS, views=False)
    mms = [v for v in fwd if case.g.nodes[v].op == "aten.addmm.default"]
    with pytest.raises(FissionError, match="not convex"):
        case.expand(case.fnode(0, [mms[0], mms[1]], 2))
    with pytest.raises(FissionError, match="overlap"):
        case.expand(case.fnode(0, fwd[:3], 2), case.fnode(1, fwd[2:5], 2))
    with pytest.raises(FissionError, match="cannot be split"):
        case.expand(case.fnode(0, fwd, 3))


def test_a_partial_result_read_inside_the_region_is_refused() -> None:
    torch.manual_seed(0)
    batch = (torch.randn(BATCH, 8), torch.randint(0, 4, (BATCH,)))
    g = peakcut.capture(ScaledByMean(), batch, mlp_loss, SPEC, keep_grads=True)
    dgraph = build_dgraph(g)
    comp = batch_component(g, dgraph)[0]
    assert comp is not None
    mean = next(v for v in g.order if g.nodes[v].op == "aten.mean.dim")
    mul = next(v for v in g.order if g.nodes[v].op == "aten.mul.Tensor")
    region = [mean, mul]
    f = FNode(id=0, nodes=frozenset(region), labels={v: comp.labels[v][0] for v in region},
              length=comp.length, component=comp.id, dominator=mean, score=0.0, heat=0, level=1,
              n=2)
    with pytest.raises(FissionError, match="partial result"):
        expand(g, g.order, FTree((f,)), dgraph)


def test_a_mean_over_the_batch_leaving_the_region_is_summed_then_divided() -> None:
    torch.manual_seed(0)
    model = ScaledByMean()
    batch = (torch.randn(BATCH, 8), torch.randint(0, 4, (BATCH,)))
    g = peakcut.capture(model, batch, mlp_loss, SPEC, keep_grads=True)
    dgraph = build_dgraph(g)
    comp = batch_component(g, dgraph)[0]
    assert comp is not None
    addmm = next(v for v in g.order if g.nodes[v].op == "aten.addmm.default")
    mean = next(v for v in g.order if g.nodes[v].op == "aten.mean.dim")
    region = [addmm, mean]
    assert why_not_valid(g, dgraph, region, comp, n=4) is None
    f = FNode(id=0, nodes=frozenset(region), labels={v: comp.labels[v][0] for v in region},
              length=comp.length, component=comp.id, dominator=addmm, score=0.0, heat=0, level=1,
              n=4)
    ex = expand(g, g.order, FTree((f,)), dgraph)
    (region_done,) = ex.regions
    (merge,) = region_done.merges
    assert ex.graph.nodes[merge].op == "aten.div_.Scalar" and ex.graph.nodes[merge].args[1] == 4
    report = peakcut.check_equivalence(model, batch, mlp_loss, SPEC,
                                       lambda _m: Step(ex.graph, ex.order), steps=2,
                                       rtol=1e-5, atol=1e-6)
    assert report.ok, str(report)
    step = Step(ex.graph, ex.order)
    measured = peakcut.measure(step, model, batch, method="cpu-profiler", repeats=1)
    assert measured.peak_bytes == simulate(ex.graph, ex.order).peak_bytes
    assert "for part in range(4):" in step.source


class LossModel(nn.Module):
    """Returns the mean cross-entropy itself: nobody reads nll_loss's total weight."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.fc(x), y)


def test_a_mean_nll_loss_divides_by_a_scratch_total_weight() -> None:
    torch.manual_seed(0)
    model = LossModel()
    batch = (torch.randn(BATCH, 8), torch.tensor([0, 1, 2, 3, -100, 1, 2, 3]))  # one ignored
    g = peakcut.capture(model, batch)                         # inference: returns the loss
    dgraph = build_dgraph(g)
    comp = batch_component(g, dgraph)[0]
    assert comp is not None
    region = [v for v in g.order if v in comp.labels]
    assert why_not_valid(g, dgraph, region, comp, n=4) is None
    f = FNode(id=0, nodes=frozenset(region), labels={v: comp.labels[v][0] for v in region},
              length=comp.length, component=comp.id, dominator=region[0], score=0.0, heat=0,
              level=1, n=4)
    ex = expand(g, g.order, FTree((f,)), dgraph)
    (done,) = ex.regions
    totals = [nid for nid in done.allocs if ex.graph.nodes[nid].name.endswith("_total")]
    assert len(totals) == 1          # the scratch total weight, freed after the division
    report = peakcut.check_equivalence(model, batch, None, None,
                                       lambda _m: Step(ex.graph, ex.order))
    assert report.ok, str(report)
    step = Step(ex.graph, ex.order)
    measured = peakcut.measure(step, model, batch, method="cpu-profiler", repeats=1)
    assert measured.peak_bytes == simulate(ex.graph, ex.order).peak_bytes
