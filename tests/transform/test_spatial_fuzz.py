"""Spatial fission on random regions (hypothesis): any stretch of a small segmentation model's
largest rows component, trimmed or not, that why_not_split_rows accepts at n = 2 or 3 splits
(split_rows does not raise, the graph checks) and gives eager's numbers over an SGD step in
float64. The models cover what a region may hold around a per-pixel loss: a batch norm (as
captured and split), a 1x1 convolution whose input gradient the region reads, a 3x3 one after
it, the input gradient read twice; the losses a mean and a sum cross-entropy with ignored
pixels and an nll loss after a log-softmax along dim -3 or 1."""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.fission.loss import detach_loss
from peakcut.fission.spatial_tree import rows_components, trimmed
from peakcut.ir.check import check_graph
from peakcut.ir.graph import Graph
from peakcut.transform.batch_norm import split_batch_norms_everywhere
from peakcut.transform.spatial import split_rows, why_not_split_rows

RTOL, ATOL = 1e-7, 1e-9   # float64
LOSSES = (("mean", -100, None), ("sum", 2, None), ("mean", 1, -3), ("mean", -100, 1))


class _Segmenter(nn.Module):
    def __init__(self, variant: int) -> None:
        super().__init__()
        self.variant = variant
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 5, 1)
        self.c3 = nn.Conv2d(5, 5, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.c1(x))
        if self.variant == 0:
            return self.c2(torch.relu(h))
        if self.variant == 1:
            return self.c3(self.c2(h))
        if self.variant == 2:
            return self.c2(h) * 2 + self.c2(h)
        y = self.c2(h)
        return y + self.c3(y)


def _loss(reduction: str, ignore: int, dim: int | None) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], torch.Tensor]:
    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        y = model(batch[0])
        if dim is None:
            return F.cross_entropy(y, batch[1], reduction=reduction, ignore_index=ignore)
        return F.nll_loss(F.log_softmax(y, dim=dim), batch[1], reduction=reduction, ignore_index=ignore)
    return loss


_CACHE: dict[tuple[int, int, bool], tuple[nn.Module, tuple[torch.Tensor, ...], object, Graph]] = {}


def _step(variant: int, loss: int, split_norms: bool) -> tuple[nn.Module, tuple[torch.Tensor, ...], object, Graph]:
    key = (variant, loss, split_norms)
    if key not in _CACHE:
        reduction, ignore, dim = LOSSES[loss]
        torch.manual_seed(variant)
        model = _Segmenter(variant).double()
        target = torch.randint(0, 5, (2, 6, 8))
        target[0, :2] = ignore
        target[1, 4:, 3:] = ignore
        batch = (torch.randn(2, 3, 6, 8, dtype=torch.float64), target)
        loss_fn = _loss(reduction, ignore, dim)
        g = detach_loss(peakcut.capture(model, batch, loss_fn, peakcut.SGD(lr=0.1), keep_grads=True))
        if split_norms:
            g = split_batch_norms_everywhere(g).graph
        _CACHE[key] = (model, batch, loss_fn, g)
    return _CACHE[key]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(variant=st.integers(0, 3), loss=st.integers(0, len(LOSSES) - 1), split_norms=st.booleans(),
       start=st.floats(0, 1, exclude_max=True), length=st.integers(1, 24), trim=st.booleans(), n=st.sampled_from([2, 3]))
def test_accepted_regions_split_and_keep_eager_numbers(variant: int, loss: int, split_norms: bool, start: float,
                                                       length: int, trim: bool, n: int) -> None:
    model, batch, loss_fn, g = _step(variant, loss, split_norms)
    nodes = list(max(rows_components(g), key=lambda c: len(c.nodes)).nodes)
    first = int(start * len(nodes))
    region = nodes[first:first + length]
    if trim:
        region = sorted(trimmed(g, frozenset(region)), key=g.order.index)
    if not region or why_not_split_rows(g, g.order, region, n) is not None:
        event("refused")
        return
    event("split")
    r = split_rows(g, g.order, region, n)
    check_graph(r.graph)
    report = peakcut.check_equivalence(copy.deepcopy(model), batch, loss_fn, peakcut.SGD(lr=0.1),
                                       lambda _m: Step(r.graph, r.order), steps=1, rtol=RTOL, atol=ATOL)
    assert report.ok, ([g.nodes[v].name for v in region], n, report)
