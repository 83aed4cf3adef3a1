"""A mean loss inside nested fission regions (found by bench.fuzz, seed 154): the inner
region's copy of the loss runs as a sum, and must merge as one. It merged as a mean again,
so the step returned the loss divided by the inner n (the gradients were right)."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

import peakcut
from peakcut.codegen.program import Step
from peakcut.optimizer import optimize_graph
from tests.helpers import cross_entropy_loss


def test_a_mean_loss_split_by_nested_regions_is_the_mean_of_the_batch() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 12), nn.GELU(), nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 3)).double()
    batch = (torch.randn(8, 5, dtype=torch.float64), torch.randint(0, 3, (8,)))
    recipe = peakcut.SGD(lr=0.05, momentum=0.9)
    g = peakcut.capture(model, batch, cross_entropy_loss, recipe, keep_grads=True)
    found = optimize_graph(g, time_budget=0, device="h200")
    deriver, root = found.deriver, found.result.root
    tree = root.tree
    with_loss = [f for f in tree.nodes
                 if any(root.base.nodes[v].op == "aten.nll_loss_forward.default" for v in f.nodes)]
    pairs = [(outer, inner) for outer in with_loss for inner in with_loss if inner.parent == outer.id]
    assert pairs, "no two nested F-Tree nodes hold the loss on this model"
    for outer, inner in pairs:
        for n_outer, n_inner in ((2, 2), (2, 4), (4, 2)):
            nested = replace(tree, nodes=tuple(
                replace(f, n={outer.id: n_outer, inner.id: n_inner}.get(f.id, 1)) for f in tree.nodes))
            state = deriver.with_tree(root, nested, f"nodes {outer.id} and {inner.id} at n = {n_outer}, {n_inner}")
            state = deriver.exact(state) if state.compact else state
            report = peakcut.check_equivalence(model, batch, cross_entropy_loss, recipe,
                                               lambda _m, s=state: Step(s.program, s.order), steps=2,
                                               rtol=1e-12, atol=1e-12)
            assert report.ok, f"{state.applied}: {report}"
