"""The full-graph GNN workloads: shapes of ROC's datasets, deterministic graphs, and planned
steps that give eager's numbers.

Each planned-step test runs `peakcut.optimize` (device="cpu", a short search) on the tiny step and
then 3 steps of the plan next to 3 eager steps (`loss.backward(); opt.step(); opt.zero_grad()`)
with torch.optim.Adam on a copy of the model, comparing loss, parameters and optimizer state.
The tolerance is float32's for sums over a vertex's in-edges and the feature width (at most
the 384 edges of the tiny graph), carried through 3 steps.
"""

from __future__ import annotations

import copy

import pytest
import torch

import peakcut
from peakcut.capture import capture
from peakcut.workloads import GNN_WORKLOAD_NAMES, WORKLOAD_NAMES, get_workload, list_workloads
from peakcut.workloads.gnn import indexed_loss, masked_loss
from peakcut.workloads.graphs import AMAZON, REDDIT, GraphShape, synthetic_graph
from tests.tolerance import tolerance

STEPS = 3
TOL = tolerance(torch.float32, 384, STEPS)
FOUR = ("reddit-gcn", "reddit-sage", "reddit-gin", "reddit-gat")


def test_registered_apart_from_the_benchmarks() -> None:
    assert set(FOUR) | {"reddit-gcn-sparse", "amazon-gcn"} == set(GNN_WORKLOAD_NAMES)
    assert not set(GNN_WORKLOAD_NAMES) & set(WORKLOAD_NAMES)
    assert not set(GNN_WORKLOAD_NAMES) & {w.name for w in list_workloads()}
    assert set(GNN_WORKLOAD_NAMES) <= {w.name for w in list_workloads(gnn=True)}
    assert get_workload("reddit-gat").paper["heads"] == 8


def test_paper_shapes_are_the_thesis_table() -> None:
    assert (REDDIT.vertices, REDDIT.edges, REDDIT.features, REDDIT.classes) == (232_965, 114_848_857, 602, 41)
    assert (AMAZON.vertices, AMAZON.edges, AMAZON.features, AMAZON.classes) == (9_430_088, 231_594_310, 300, 24)
    inst = get_workload("reddit-gcn").build("paper")
    x, src, dst, labels, mask = inst.batch
    assert all(t.device.type == "meta" for t in inst.batch)
    assert x.shape == (232_965, 602) and src.shape == dst.shape == (114_848_857,)
    assert labels.dtype == torch.int64 and mask.dtype == torch.bool


def test_graph_is_deterministic_power_law_and_grouped_by_destination() -> None:
    shape = GraphShape(vertices=500, edges=20_000, features=4, classes=3)
    a, b = synthetic_graph(shape, seed=3), synthetic_graph(shape, seed=3)
    assert all(torch.equal(s, t) for s, t in zip(a.as_tuple(), b.as_tuple(), strict=True))
    assert not torch.equal(a.src, synthetic_graph(shape, seed=4).src)
    assert bool((a.dst[1:] >= a.dst[:-1]).all()) and not bool((a.src == a.dst).any())
    deg = torch.bincount(a.dst, minlength=shape.vertices).sort(descending=True).values
    assert deg[:5].float().mean() > 10 * deg.float().median()       # a heavy head: a power law, not uniform
    with pytest.raises(ValueError, match="edges"):
        GraphShape(vertices=5, edges=0, features=1, classes=1)


def test_tiny_build_is_seeded_and_batch_is_one_graph() -> None:
    w = get_workload("reddit-gcn")
    one, two = w.build("tiny", seed=1), w.build("tiny", seed=1)
    assert all(torch.equal(s, t) for s, t in zip(one.batch, two.batch, strict=True))
    with pytest.raises(ValueError, match="batch_size=2"):
        w.build("tiny", batch_size=2)


def test_masked_loss_equals_indexed_loss() -> None:
    inst = get_workload("reddit-sage").build("tiny")
    torch.testing.assert_close(masked_loss(inst.model, inst.batch), indexed_loss(inst.model, inst.batch))


@pytest.mark.parametrize("name", FOUR)
def test_tiny_plan_gives_eager_numbers(name: str) -> None:
    inst = get_workload(name).build("tiny")
    model, batch = inst.model, inst.batch
    ref = copy.deepcopy(model)
    opt, ref_opt = torch.optim.Adam(model.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, batch, inst.loss_fn, opt, device="cpu", time_budget=1.0, max_states=4)
    for k in range(STEPS):
        loss = plan.step(batch)
        ref_loss = inst.loss_fn(ref, batch)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(loss, ref_loss.detach(), rtol=TOL, atol=TOL, msg=lambda m, k=k: f"loss {k}: {m}")
    for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=TOL, atol=TOL, msg=lambda m, n=pname: f"{n}: {m}")
    ours, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    assert ours.keys() == theirs.keys()
    for i, slots in theirs.items():
        for key, value in slots.items():
            torch.testing.assert_close(ours[i][key], value, rtol=TOL, atol=TOL)


def test_paper_gat_captures_over_fake_tensors() -> None:
    inst = get_workload("reddit-gat").build("paper")
    g = capture(inst.model, inst.batch, inst.loss_fn, "adam", device="cpu")
    edges = REDDIT.edges
    assert any(t.shape[:1] == (edges,) and t.role.value == "activation" for t in g.tensors.values())
