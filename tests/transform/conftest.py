"""Small graphs for the rule tests: the CNN of tests/conftest.py with AdamW (gradients kept
as outputs, for equivalence checks), an MLP whose hidden
activation is overwritten in place (ReLU(inplace=True)), an MLP with dropout, and one that
allocates with empty_like."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch
from torch import nn

import peakcut
from peakcut.ir.graph import Graph
from tests.conftest import SmallCNN, cnn_loss


class InplaceMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU(inplace=True)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DropoutMLP(InplaceMLP):
    """Dropout (captured as empty_like + bernoulli_ + div_ + mul) and Gaussian noise
    (randn_like)."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.ReLU()
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = h + 0.01 * torch.randn_like(h)
        return self.fc2(self.drop(self.act(h)))


class EmptyLikeMLP(InplaceMLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        buf = torch.empty_like(h)
        buf.copy_(h)
        return self.fc2(torch.relu(buf))


class SliceMLP(InplaceMLP):
    """A dense slice at a nonzero storage offset, read through a view (moves with a swap)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        bottom = h[3:]  # rows 3..5: dense, at storage offset 3 * 16
        return self.fc2(torch.cat([h[:3], torch.relu(bottom.view(-1, 16))]))


class TwoScales(nn.Module):
    """x * p1 * p2: the backward reads x * p1 for p2's gradient, but p1's update does not wait
    for that reader (p1's gradient needs neither p1 nor x * p1), so a recompute of x * p1 is
    ordered before p1's in-place update only by the control edge remat adds."""

    def __init__(self) -> None:
        super().__init__()
        self.p1 = nn.Parameter(torch.randn(4, 8))
        self.p2 = nn.Parameter(torch.randn(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.p1 * self.p2


def square_loss(model: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
    return model(batch[0]).square().mean()


def mlp_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def mlp_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(6, 8), torch.randint(0, 4, (6,))


@pytest.fixture
def cnn() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    return SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,)))


@pytest.fixture
def cnn_graph(cnn) -> Graph:
    model, batch = cnn
    return peakcut.capture(model, batch, cnn_loss, "adamw", keep_grads=True)


@pytest.fixture
def cnn_train_graph(cnn) -> Graph:
    """The CNN step as it would be optimized: gradients are not program outputs."""
    model, batch = cnn
    return peakcut.capture(model, batch, cnn_loss, "adamw")


@pytest.fixture
def inplace_graph() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(InplaceMLP(), mlp_batch(), mlp_loss, "adamw")


@pytest.fixture
def dropout_graph() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(DropoutMLP().train(), mlp_batch(), mlp_loss, "adamw")


@pytest.fixture
def slice_graph() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(SliceMLP(), mlp_batch(), mlp_loss, "adamw", keep_grads=True)


@pytest.fixture
def empty_like_graph() -> Graph:
    torch.manual_seed(0)
    return peakcut.capture(EmptyLikeMLP(), mlp_batch(), mlp_loss, "adamw")


def node_with_op(g: Graph, op: str, nth: int = 0) -> int:
    """The nth node (capture order) running `op` ('aten.add_.Tensor', 'add_.Tensor' or 'mm')."""
    full = {0: f"aten.{op}.default", 1: f"aten.{op}"}.get(op.count("."), op)
    found = [n for n in g.order if g.nodes[n].op == full]
    if len(found) <= nth:
        raise LookupError(f"no node #{nth} running {full}")
    return found[nth]


def random_topological_order(g: Graph, seed: int, defer: Sequence[int] = ()) -> list[int]:
    """Kahn's algorithm picking a random ready node each time: any valid order of g. Nodes in
    `defer` are picked only when nothing else is ready (as late as the dependencies allow)."""
    rng = random.Random(seed)
    preds = {n: set(g.predecessors(n)) for n in g.nodes}
    succs: dict[int, list[int]] = {n: [] for n in g.nodes}
    for n, ps in preds.items():
        for p in ps:
            succs[p].append(n)
    ready = sorted(n for n, ps in preds.items() if not ps)
    order: list[int] = []
    late = set(defer)
    while ready:
        eager = [i for i, n in enumerate(ready) if n not in late]
        n = ready.pop(rng.choice(eager) if eager else rng.randrange(len(ready)))
        order.append(n)
        for s in succs[n]:
            preds[s].discard(n)
            if not preds[s]:
                ready.append(s)
    return order
