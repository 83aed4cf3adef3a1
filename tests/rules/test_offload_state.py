"""Optimizer-state offload (rules/offload_state_rule.py): where it applies and why not, eager's
numbers over several steps (loss, parameters, optimizer state, checkpoints), device memory
without the state, placement, generated code and the search choosing it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import nn

import peakcut
from peakcut.ir.check import check_graph
from peakcut.ir.graph import Graph
from peakcut.ir.ops import LOAD_OP, WRITEBACK_OP
from peakcut.ir.tensor import Role
from peakcut.memory import simulate
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import MoveSettings
from peakcut.rules import RULES
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.offload_state_rule import OffloadStateRule
from peakcut.schedule.placement import Placement
from tests.helpers import cross_entropy_loss, make_mlp
from tests.tolerance import tolerance

RULE = OffloadStateRule()
STEPS = 3
TOL = tolerance(torch.float32, 16, STEPS)


loss_fn = cross_entropy_loss
make = make_mlp


def site(g: Graph, tensor: int) -> HotspotSite:
    users = tuple(g.users(tensor))
    return HotspotSite(tensor, users[0] if users else -1, users, g.tensors[tensor].nbytes, 0)


def offload_all(g: Graph, order: Sequence[int]) -> tuple[Graph, list[int]]:
    """Every optimizer-state input of g kept in host memory."""
    out = list(order)
    for t in [t for t in g.inputs if g.tensors[t].role is Role.OPT_STATE]:
        if RULE.why_not(g, out, site(g, t)) is None:
            rw = RULE.apply(g, out, site(g, t))
            g, out = rw.graph, rw.order
    return g, out


def state_input(g: Graph, name: str) -> int:
    return g.inputs[g.input_names.index(name)]


# ------------------------------------------------------------------ where it applies
def test_it_applies_to_optimizer_state_only() -> None:
    model, batch = make()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    order = list(g.order)
    moment = state_input(g, "state:fc1.weight.exp_avg")
    assert RULE.why_not(g, order, site(g, moment)) is None
    param = state_input(g, "param:fc1.weight")
    assert "not optimizer state (param)" in (RULE.why_not(g, order, site(g, param)) or "")
    batch_input = state_input(g, "batch:0")
    assert "not optimizer state (input)" in (RULE.why_not(g, order, site(g, batch_input)) or "")
    done = RULE.apply(g, order, site(g, moment)).graph
    assert "in host memory already" in (RULE.why_not(done, done.order, site(done, moment)) or "")
    unknown = HotspotSite(10**9, -1, (), 0, 0)
    assert RULE.why_not(g, order, unknown) == f"tensor {10**9} is not a program input"


def test_the_rewrite_is_a_load_the_update_on_a_copy_and_a_writeback() -> None:
    model, batch = make()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    moment = state_input(g, "state:fc1.weight.exp_avg")
    rw = RULE.apply(g, g.order, site(g, moment))
    new = rw.graph
    check_graph(new)
    assert new.host_inputs() == [moment]
    load, back = (new.nodes[n] for n in rw.added)
    assert (load.op, back.op) == (LOAD_OP, WRITEBACK_OP)
    assert new.users(moment) == [load.id, back.id]          # nothing else touches the host copy
    copy_storage = new.tensors[load.output_ids()[0]].storage
    assert all(new.tensors[t].storage == copy_storage for t in back.input_ids()[1:])
    assert rw.order.index(load.id) < min(rw.order.index(u) for u in rw.changed) < rw.order.index(back.id)
    assert RULES.placements(new) == {load.id: Placement.HIDDEN, back.id: Placement.EARLY}


def test_device_memory_no_longer_holds_the_state_outside_its_update() -> None:
    model, batch = make()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    state_bytes = sum(g.storages[g.tensors[t].storage] for t in g.inputs
                      if g.tensors[t].role is Role.OPT_STATE)
    offloaded, order = offload_all(g, g.order)
    before, after = simulate(g, g.order), simulate(offloaded, order)
    assert after.baseline_bytes == before.baseline_bytes - state_bytes
    assert after.peak_bytes < before.peak_bytes


# ------------------------------------------------------------------ same numbers as eager
OPTIMIZERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.8, 0.95)),
    "adam-amsgrad": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, amsgrad=True),
    "sgd-momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
}


def eager_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, torch.Tensor]
               ) -> torch.Tensor:
    """The user's eager loop for one batch; returns the loss."""
    loss = loss_fn(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(a, b, rtol=TOL, atol=TOL, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_an_offloaded_step_keeps_eager_numbers(name: str) -> None:
    model, batch = make()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](model), OPTIMIZERS[name](ref)
    g, order = offload_all(*(lambda g: (g, g.order))(peakcut.capture(model, batch, loss_fn, opt)))
    assert g.host_inputs()
    step = peakcut.build(g, order, optimizer=opt)
    assert "lives in host memory" in step.source and "torch.ops.peakcut" not in step.source
    for k in range(STEPS):
        assert_close(step(model, batch), eager_step(ref, ref_opt, batch), f"loss at step {k}")
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert_close(p, q, f"{pname} at step {k}")
    ours, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    for i, slots in theirs.items():
        for slot, value in slots.items():
            assert_close(ours[i][slot], value, f"state {i}.{slot}")


def test_a_checkpoint_saved_and_loaded_around_an_offloaded_step() -> None:
    """The optimizer's state tensors stay the user's: state_dict saves them, load_state_dict
    puts them beside the parameters and the step takes them back to host memory."""
    model, batch = make()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    g, order = offload_all(*(lambda g: (g, g.order))(peakcut.capture(model, batch, loss_fn, opt)))
    step = peakcut.build(g, order, optimizer=opt)
    for _ in range(2):
        step(model, batch)
        eager_step(ref, ref_opt, batch)
    saved = copy.deepcopy(opt.state_dict())
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt2.load_state_dict(saved)
    step2 = peakcut.build(g, order, optimizer=opt2)
    step2(model, batch)
    eager_step(ref, ref_opt, batch)
    for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_close(p, q, pname)


# ------------------------------------------------------------------ the search
def test_the_search_chooses_it_under_a_memory_limit() -> None:
    model, batch = make()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    g = peakcut.capture(model, batch, loss_fn, opt)
    found = optimize_graph(g, memory_limit=0.5, time_budget=60, max_states=40, device="rtx3090",
                           settings=MoveSettings.only("offload_state"))
    best = found.result.best
    assert [r.kind for r in best.recipes] and {r.kind for r in best.recipes} == {"offload_state"}
    assert best.program.host_inputs()
    step = peakcut.build(best.program, list(best.order), optimizer=opt)
    for k in range(STEPS):
        assert_close(step(model, batch), eager_step(ref, ref_opt, batch), f"loss at step {k}")


def test_measured_device_memory_drops_by_the_state_kept_in_host_memory() -> None:
    """cpu-profiler measurement (host buffers are numpy-backed on CPU, apart from the allocator
    it sees): the offloaded step's measured peak stays within the simulated one, below the
    plain step's."""
    model, batch = make()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = peakcut.capture(model, batch, loss_fn, opt)
    offloaded, order = offload_all(g, g.order)
    plain = peakcut.measure(peakcut.build(g), copy.deepcopy(model), batch,
                            method="cpu-profiler", repeats=1).peak_bytes
    kept = peakcut.measure(peakcut.build(offloaded, order), copy.deepcopy(model), batch,
                           method="cpu-profiler", repeats=1).peak_bytes
    print(f"measured peak: plain {plain:,} B, offloaded {kept:,} B; simulated {simulate(offloaded, order).peak_bytes:,} B")
    assert kept < plain
    assert kept <= simulate(offloaded, order).peak_bytes


def test_a_grad_scalers_scale_stays_on_the_device() -> None:
    """The scale is caller-held state of the step, but no optimizer state: it is read by the
    forward (the scaled loss), so keeping it in host memory would save nothing."""
    model, batch = make()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()), grad_scaler=True)
    scale = state_input(g, "scaler:scale")
    assert RULE.why_not(g, g.order, site(g, scale)) is not None
    offloaded, _ = offload_all(g, g.order)
    assert scale not in offloaded.host_inputs() and offloaded.host_inputs()
