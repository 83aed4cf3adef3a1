"""Spatial regions through a per-pixel loss (peakcut.transform.spatial, issue 18): a region
that runs U-Net's last normalize, its ReLU, the 1x1 output convolution, the log-softmax, the
mean cross-entropy over pixels, and their backwards up to the ReLU's in parts along the rows.

- eager's numbers over 3 AdamW steps in float64 (the parts sum the loss and the weight
  gradients in another order) at n = 2 and the largest n, with the batch norms split and as
  captured; the measured peak within 5% of the simulated one at n = 2;
- the generated program sums the parts' losses and divides once by the counted pixels;
- what is refused names the op: a weighted or unreduced loss, a softmax along the rows, a
  detach of a parameter, a tensor made in the region that it reads only whole (a doubled
  convolution weight);
- on the paper-size U-Net (simulated), the rows' F-Tree has a root that lowers the peak at
  n = 2 (bench.fission's figure), which hands on no `x - mean` of the next batch norm's
  backward.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.fission.loss import detach_loss
from peakcut.fission.spatial_tree import best_spatial_root, find_spatial_ftree
from peakcut.ir.check import check_graph
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.transform.batch_norm import split_batch_norms_everywhere
from peakcut.transform.spatial import (
    NLL_FORWARD,
    ROWS,
    split_rows,
    why_not_node,
    why_not_split_rows,
)
from peakcut.workloads import get_workload
from tests.helpers import in_float64

RTOL, ATOL = 1e-7, 1e-9   # float64


def _unet() -> tuple[nn.Module, tuple[torch.Tensor, ...], object]:
    inst = in_float64(get_workload("unet").build("tiny"))
    return inst.model, inst.batch, inst.loss_fn


def _through_the_loss(g: Graph) -> list[int]:
    """Every node split_rows can split from the last image-sized op before the output
    convolution (the normalize with the batch norms split, else the ReLU) to the first ReLU
    backward."""
    order = list(g.order)
    loss = next(i for i, v in enumerate(order) if g.nodes[v].op == NLL_FORWARD)
    start_ops = ("aten.addcmul.default", "aten.relu.default")
    first = max(i for i, v in enumerate(order[:loss]) if g.nodes[v].op in start_ops
                and (g.nodes[v].op == start_ops[0] or not any(g.nodes[u].op == start_ops[0] for u in order[i - 3:i])))
    last = next(i for i, v in enumerate(order) if g.nodes[v].op == "aten.threshold_backward.default")
    return [v for v in order[first:last + 1] if why_not_node(g, v) is None]


@pytest.mark.parametrize("split_norms", [True, False], ids=["batch norms split", "captured"])
def test_a_region_through_the_loss_keeps_eager_numbers(split_norms: bool) -> None:
    model, batch, loss_fn = _unet()
    g = detach_loss(peakcut.capture(model, batch, loss_fn, peakcut.AdamW(), keep_grads=True))
    if split_norms:
        g = split_batch_norms_everywhere(g).graph
    nodes = _through_the_loss(g)
    ops = {g.nodes[v].op for v in nodes}
    assert {NLL_FORWARD, "aten.nll_loss2d_backward.default", "aten.convolution_backward.default",
            "aten._log_softmax.default", "aten.threshold_backward.default"} <= ops, ops
    height = g.tensors[g.nodes[nodes[-1]].output_ids()[0]].shape[ROWS]
    for n in (2, height):
        assert why_not_split_rows(g, g.order, nodes, n) is None, n
        r = split_rows(g, g.order, nodes, n)
        check_graph(r.graph)
        step = Step(r.graph, r.order)
        report = peakcut.check_equivalence(copy.deepcopy(model), batch, loss_fn, peakcut.AdamW(),
                                           lambda _m, r=r: Step(r.graph, r.order), steps=3, rtol=RTOL, atol=ATOL)
        assert report.ok, f"n={n}: {report}"
        assert {"loss", "grad", "param", "state"} <= report.kinds()
        if n == 2:
            source = step.source
            assert source.count("aten.nll_loss2d_forward.default(") == n
            assert source.count("_mean = aten.div_.Tensor(") == 1
            simulated = simulate(r.graph, r.order).peak_bytes
            measured = peakcut.measure(step, copy.deepcopy(model), batch, method="cpu-profiler", repeats=1).peak_bytes
            assert abs(simulated - measured) <= 0.05 * measured, (simulated, measured)
    assert why_not_split_rows(g, g.order, nodes, height + 1) is not None


class _Segmenter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.register_buffer("class_weight", torch.tensor([1.0, 2.0, 1.0, 0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def _loss_node(loss_fn: object, op: str = NLL_FORWARD) -> tuple[Graph, int]:
    model = _Segmenter()
    batch = (torch.randn(2, 3, 8, 8), torch.randint(0, 4, (2, 8, 8)))
    g = peakcut.capture(model, batch, loss_fn, peakcut.SGD(lr=0.1))
    return g, next(v for v in g.order if g.nodes[v].op == op)


def test_refusals_name_the_loss() -> None:
    g, v = _loss_node(lambda m, b: F.cross_entropy(m(b[0]), b[1], weight=m.class_weight))
    reason = why_not_node(g, v)
    assert reason is not None and "nll_loss2d_forward" in reason and "weighs its classes" in reason
    g, v = _loss_node(lambda m, b: F.cross_entropy(m(b[0]), b[1], reduction="none").mean())
    reason = why_not_node(g, v)
    assert reason is not None and "reduction 0" in reason
    g, v = _loss_node(lambda m, b: -F.log_softmax(m(b[0]), dim=2).mean(), "aten._log_softmax.default")
    reason = why_not_node(g, v)
    assert reason is not None and "_log_softmax" in reason and "along the rows" in reason
    g, conv = _loss_node(lambda m, b: F.cross_entropy(m(b[0]), b[1]), "aten.convolution.default")
    weight = g.producer(g.nodes[conv].args[1].id)      # the weight's detach
    reason = why_not_node(g, weight)
    assert reason is not None and g.nodes[weight].name in reason and "a param tensor" in reason
    g, conv = _loss_node(lambda m, b: F.cross_entropy(F.conv2d(b[0], m.conv.weight * 2, m.conv.bias, padding=1), b[1]),
                         "aten.convolution.default")
    g = detach_loss(g)
    doubled = g.producer(g.nodes[conv].args[1].id)     # weight * 2: a 4-D tensor the region reads whole
    back = next(v for v in g.order if g.nodes[v].op == "aten.convolution_backward.default")
    span = g.order[g.order.index(conv):g.order.index(back) + 1]
    nodes = [doubled, *(v for v in span if why_not_node(g, v) is None)]
    assert why_not_node(g, doubled) is None
    reason = why_not_split_rows(g, g.order, nodes, 2)
    assert reason is not None and g.nodes[doubled].name in reason and "only whole" in reason
    assert why_not_split_rows(g, g.order, nodes[1:], 2) is None


def test_the_paper_unet_tree_has_a_root_that_lowers_the_peak_at_two_parts() -> None:
    """bench.fission's figure (simulated, CPU workspace model): the root is the region through
    the loss, and it is trimmed of the next batch norm's backward ops that would hand on whole
    images (spatial_tree.trimmed)."""
    inst = get_workload("unet").build("paper")
    g = detach_loss(peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw"))
    h = split_batch_norms_everywhere(g).graph
    tree = find_spatial_ftree(h)
    best = best_spatial_root(h, tree, 2)
    assert best is not None
    root, peak = best
    assert peak < simulate(h).peak_bytes
    ops = {h.nodes[v].op for v in tree.nodes[root].nodes}
    names = {h.nodes[v].name for v in tree.nodes[root].nodes}
    assert NLL_FORWARD in ops and "aten.convolution_backward.default" in ops
    assert not any(name.endswith("_centered") for name in names), names
