"""The physical floors (optimizer/floors.py) are lower bounds: no simulated plan goes below them,
and they are what the module says on a step small enough to work out by hand."""

from __future__ import annotations

import pytest
import torch

import peakcut
from peakcut.cost import get_cost_model
from peakcut.cost.profiles import get_profile
from peakcut.ir.node import Phase
from peakcut.ir.tensor import Role
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.floors import step_floors, working_set_bytes
from peakcut.simulate import simulate_timeline
from peakcut.workloads import get_workload
from tests.helpers import cross_entropy_loss, make_mlp


@pytest.mark.parametrize("device", ["h100", "rtx3090"])
def test_no_simulated_plan_goes_below_the_floors(device: str) -> None:
    inst = get_workload("bert-base").build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    floors = step_floors(g, get_profile(device))
    eager = simulate_timeline(g, g.order, get_cost_model(device))
    assert 0 < floors.memory_bytes <= eager.peak_bytes
    assert 0 < floors.compute_seconds < eager.latency_seconds
    found = optimize_graph(g, device=device, pareto=True, time_budget=120, max_states=40, seed=0)
    assert found.report["floors"]["memory_bytes"] == floors.memory_bytes
    for state in found.result.front:
        assert state.peak_bytes >= floors.memory_bytes
        assert state.latency_s >= floors.compute_seconds


def test_the_floors_of_a_small_step_by_hand() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, cross_entropy_loss, torch.optim.AdamW(model.parameters()))
    profile = get_profile("h100")
    floors = step_floors(g, profile, workspace=None)
    # the memory floor is one op's own tensors: at least the largest tensor the step makes
    largest = max(m.nbytes for m in g.tensors.values())
    assert floors.memory_bytes >= largest
    assert floors.memory_bytes == max(working_set_bytes(g, n) for n in g.order)
    params = sum(g.tensors[t].nbytes for t in g.inputs if g.tensors[t].role is Role.PARAM)
    state = sum(g.tensors[t].nbytes for t in g.inputs if g.tensors[t].role is Role.OPT_STATE)
    assert floors.state_bytes == params + state
    assert floors.device_update_copy_seconds == pytest.approx((params + state) / profile.h2d_bandwidth)
    # the host way moves the parameters in and their gradients out: at least that long
    assert floors.host_update_seconds >= params / profile.h2d_bandwidth
    assert floors.latency_at_memory_floor_seconds == pytest.approx(max(
        floors.compute_seconds, min(floors.device_update_copy_seconds, floors.host_update_seconds)))
    assert floors.overhead(2 * floors.compute_seconds) == pytest.approx(1.0)


def test_a_faster_host_makes_the_host_update_cheaper() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, cross_entropy_loss, torch.optim.AdamW(model.parameters()))
    assert any(g.nodes[n].phase is Phase.OPTIMIZER for n in g.order)
    slow = step_floors(g, get_profile("h100"), host_threads=1)
    fast = step_floors(g, get_profile("h100"), host_threads=64)
    assert fast.host_update_seconds <= slow.host_update_seconds
    with pytest.raises(ValueError, match="host_threads"):
        step_floors(g, get_profile("h100"), host_threads=0)
