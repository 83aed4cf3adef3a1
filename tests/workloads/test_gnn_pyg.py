"""PyTorch Geometric's GCNConv, SAGEConv and GATConv with their defaults: captured (GCNConv's
and GATConv's self-loop handling and the boolean train mask specialised on the capture batch's
values) and planned, giving eager's numbers over 3 Adam steps. Skipped without torch_geometric
(the `pyg` extra)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import peakcut
from peakcut.ir.guards import NONZERO_COUNTED_OP
from tests.helpers import step_against_eager
from tests.tolerance import tolerance

pyg_nn = pytest.importorskip("torch_geometric.nn")

V, E, FEATURES, CLASSES = 60, 360, 8, 3
TOL = tolerance(torch.float32, E, 3)


class Net(nn.Module):
    def __init__(self, conv: type) -> None:
        super().__init__()
        self.conv1, self.conv2 = conv(FEATURES, 8), conv(8, CLASSES)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, edge_index, labels, mask = batch
    return F.cross_entropy(model(x, edge_index)[mask], labels[mask])


@pytest.mark.parametrize("conv", ["GCNConv", "SAGEConv", "GATConv"])
def test_pyg_conv_with_defaults_plans_and_gives_eager_numbers(conv: str) -> None:
    gen = torch.Generator().manual_seed(0)
    batch = (torch.randn(V, FEATURES, generator=gen), torch.randint(0, V, (2, E), generator=gen),
             torch.randint(0, CLASSES, (V,), generator=gen), torch.rand(V, generator=gen) < 0.5)
    torch.manual_seed(0)
    model = Net(getattr(pyg_nn, conv))
    ref = copy.deepcopy(model)
    opt, ref_opt = torch.optim.Adam(model.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, batch, loss_fn, opt, device="cpu", time_budget=0.5, max_states=2)
    assert any(n.op == NONZERO_COUNTED_OP for n in plan.graph.nodes.values())
    step_against_eager(plan, model, opt, ref, ref_opt, loss_fn, [batch] * 3, TOL)
