"""What stands at a plan's peak (optimizer.peak_standing): the bytes by kind add up to the
simulated peak, those tied to a fission region's parts are told apart, and a memory limit
that is not met says so in LimitNotMet's message and in the report."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import peakcut
from peakcut.cost import get_cost_model
from peakcut.ir.tensor import Role
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.derive import Deriver
from peakcut.optimizer.peak_standing import peak_standing
from peakcut.optimizer.plan import LimitNotMet
from peakcut.simulate import simulate_timeline
from peakcut.workloads import get_workload
from tests.helpers import cross_entropy_loss
from tests.rules.test_offload_param import RULE as PARAM_RULE
from tests.rules.test_offload_param import offload


@pytest.fixture(scope="module")
def step():
    inst = get_workload("gpt2-xl").build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    return inst, g


def test_the_kinds_add_up_to_the_peak_and_nothing_is_in_parts_without_fission(step) -> None:
    _, g = step
    cost = get_cost_model("h100")
    timeline = simulate_timeline(g, g.order, cost)
    standing = peak_standing(g, timeline, optimize_graph(g, time_budget=0, device="h100").result.root.tree)
    assert sum(standing.by_kind.values()) == timeline.peak_bytes == standing.peak_bytes
    assert standing.by_kind["activations"] > 0 and standing.by_kind["optimizer state"] > 0
    assert standing.in_parts == {} and standing.regions == ()
    assert "fission" not in standing.sentence()


def test_bytes_made_or_read_by_the_parts_of_a_region_at_its_most_parts(step) -> None:
    _, g = step
    cost = get_cost_model("h100")
    root = optimize_graph(g, time_budget=0, device="h100").result.root
    widest = max(root.tree.nodes, key=lambda f: len(f.nodes))
    deriver = Deriver(cost, "cpu")
    split = deriver.exact(deriver.with_tree(root, root.tree.with_n(widest.id, widest.length), "test"))
    timeline = simulate_timeline(split.program, split.order, cost)
    standing = peak_standing(split.program, timeline, split.tree)
    assert sum(standing.by_kind.values()) == timeline.peak_bytes
    assert 0 < standing.in_parts_bytes <= standing.peak_bytes
    assert all(standing.in_parts[k] <= standing.by_kind[k] for k in standing.in_parts)
    params = sum(g.tensors[t].nbytes for t in g.inputs if g.tensors[t].role.value == "param")
    assert standing.in_parts.get("parameters", 0) <= params
    (region,) = standing.regions
    assert (region.ftree_node, region.n, region.at_most_parts) == (widest.id, widest.length, True)
    assert f"in {widest.length} parts (its most" in standing.sentence()
    assert standing.as_dict()["in_fission_parts_bytes"] == standing.in_parts_bytes


def test_a_memory_limit_not_met_says_what_stands_at_the_peak(step) -> None:
    inst, g = step
    found = optimize_graph(g, memory_limit="100KB", device="h100", time_budget=3, max_states=20)
    assert not found.report["feasible"]
    standing = found.report["peak_standing"]
    assert standing["peak_bytes"] == found.report["peak_bytes"]
    assert sum(standing["by_kind"].values()) == standing["peak_bytes"]
    with pytest.raises(LimitNotMet, match="at the best plan's peak"):
        peakcut.optimize(inst.model, inst.batch, inst.loss_fn, memory_limit="100KB", device="h100",
                         time_budget=5, max_states=20)


def test_gradients_and_device_copies_of_host_kept_parameters_are_named_for_what_they_hold() -> None:
    """A weight gradient is made by an mm whose result is viewed as the gradient (one storage,
    roles activation and grad): a gradient. The device copy a load makes of a parameter kept in
    host memory: a parameter. The update's own results: update temporaries."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))
    batch = (torch.randn(2, 512), torch.randint(0, 4, (2,)))
    g = peakcut.capture(model, batch, cross_entropy_loss, torch.optim.AdamW(model.parameters()))
    tree = optimize_graph(g, time_budget=0, device="h100").result.root.tree
    g, order = offload(g, list(g.order), PARAM_RULE, Role.PARAM)
    timeline = simulate_timeline(g, order, get_cost_model("h100"))
    standing = peak_standing(g, timeline, tree)
    weight = 512 * 512 * 4
    assert standing.by_kind["gradients"] >= weight and standing.by_kind["parameters"] >= weight
    assert standing.by_kind.get("activations", 0) < 1024, standing.by_kind
    assert standing.by_kind["update temporaries"] >= weight
    assert sum(standing.by_kind.values()) == timeline.peak_bytes


def test_a_limit_met_has_no_standing(step) -> None:
    _, g = step
    found = optimize_graph(g, memory_limit=1.0, device="h100", time_budget=0)
    assert found.report["feasible"] and "peak_standing" not in found.report
