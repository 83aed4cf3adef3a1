"""Parameter offload (rules/offload_param_rule.py): where it applies and why not, the rewrite
(one load per phase, views made again, one writeback), eager's numbers over several steps with
the state offloaded too and the gradients swapped, device memory, checkpoints and the search."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.source import generate_source
from peakcut.codegen.swap import simulated_host_peak
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.ops import LOAD_OP, STORE_OP, WRITEBACK_OP
from peakcut.ir.tensor import Role
from peakcut.memory import simulate
from peakcut.optimizer import optimize_graph
from peakcut.optimizer.children import MoveSettings
from peakcut.rules import RULES
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.offload_param_rule import OffloadParamRule
from peakcut.rules.offload_state_rule import OffloadStateRule
from peakcut.schedule.placement import Placement
from peakcut.transform.swap import swap, why_not_swap
from peakcut.workloads import WorkloadInstance, get_workload
from tests.helpers import cross_entropy_loss, make_mlp
from tests.tolerance import tolerance

RULE = OffloadParamRule()
STATE_RULE = OffloadStateRule()
STEPS = 3
TOL = tolerance(torch.float32, 16, STEPS)
loss_fn = cross_entropy_loss


def site(g: Graph, tensor: int) -> HotspotSite:
    users = tuple(g.users(tensor))
    return HotspotSite(tensor, users[0] if users else -1, users, g.tensors[tensor].nbytes, 0)


def named_input(g: Graph, name: str) -> int:
    return g.inputs[g.input_names.index(name)]


def offload(g: Graph, order: Sequence[int], rule: OffloadParamRule | OffloadStateRule, role: Role
            ) -> tuple[Graph, list[int]]:
    """Every input of `role` that `rule` takes, kept in host memory."""
    out = list(order)
    for t in [t for t in g.inputs if g.tensors[t].role is role]:
        if rule.why_not(g, out, site(g, t)) is None:
            rw = rule.apply(g, out, site(g, t))
            g, out = rw.graph, rw.order
    return g, out


def swap_gradients(g: Graph, order: Sequence[int]) -> tuple[Graph, list[int]]:
    """Every gradient swapped out once made and back in for its update."""
    out = list(order)
    for t in [t for t, m in g.tensors.items() if m.role is Role.GRAD]:
        users = [u for u in out if t in g.nodes[u].input_ids()]
        if users and why_not_swap(g, out, t, users) is None:
            rw = swap(g, out, t, users)
            g, out = rw.graph, rw.order
    return g, out


def everything_on_host(g: Graph) -> tuple[Graph, list[int]]:
    g, order = offload(g, g.order, RULE, Role.PARAM)
    g, order = offload(g, order, STATE_RULE, Role.OPT_STATE)
    return swap_gradients(g, order)


# ------------------------------------------------------------------ where it applies
def test_it_applies_to_parameters_only() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    order = list(g.order)
    weight = named_input(g, "param:fc1.weight")
    assert RULE.why_not(g, order, site(g, weight)) is None
    moment = named_input(g, "state:fc1.weight.exp_avg")
    assert "not a parameter (opt_state)" in (RULE.why_not(g, order, site(g, moment)) or "")
    assert "not a parameter (input)" in (RULE.why_not(g, order, site(g, named_input(g, "batch:0"))) or "")
    done = RULE.apply(g, order, site(g, weight)).graph
    assert "in host memory already" in (RULE.why_not(done, done.order, site(done, weight)) or "")
    assert RULE.why_not(g, order, HotspotSite(10**9, -1, (), 0, 0)) == f"tensor {10**9} is not a program input"


def test_a_gradient_the_caller_accumulates_keeps_its_parameter_on_the_device() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()), accumulate=True)
    weight = named_input(g, "param:fc1.weight")
    assert "adds to its p.grad in place" in (RULE.why_not(g, g.order, site(g, weight)) or "")


def test_gradients_returned_to_the_caller_are_eager_ones() -> None:
    """keep_grads: p.grad after the step is eager's (in host memory with its parameter on CUDA)."""
    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS["adamw"](model), OPTIMIZERS["adamw"](ref)
    captured = peakcut.capture(model, batch, loss_fn, opt, keep_grads=True)
    g, order = offload(captured, captured.order, RULE, Role.PARAM)
    assert len(g.host_inputs()) == 6
    step = peakcut.build(g, order, optimizer=opt)
    for _ in range(2):
        opt.zero_grad()
        step(model, batch)
        loss_fn(ref, batch).backward()
        ref_opt.step()
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert p.grad is not None and q.grad is not None
            assert_close(p.grad, q.grad, f"{pname}.grad")
        ref_opt.zero_grad()


def test_the_rewrite_is_a_load_per_phase_views_made_again_and_one_writeback() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    weight = named_input(g, "param:fc2.weight")
    rw = RULE.apply(g, g.order, site(g, weight))
    new = rw.graph
    check_graph(new)
    assert new.host_inputs() == [weight]
    loads = [n for n in rw.added if new.nodes[n].op == LOAD_OP]
    backs = [n for n in rw.added if new.nodes[n].op == WRITEBACK_OP]
    assert [new.nodes[n].phase for n in loads] == [Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER]
    assert len(backs) == 1 and set(new.users(weight)) == {*loads, *backs}
    assert set(loads) <= set(new.control[backs[0]])           # the host copy changes after every load
    storages = [new.tensors[new.nodes[n].output_ids()[0]].storage for n in loads]
    assert len(set(storages)) == 3 and weight not in new.nodes[backs[0]].input_ids()[1:]
    # the backward reads the forward's transposed weight: made again from the backward's copy
    remade = [n for n in rw.added if n not in loads and n not in backs]
    assert remade and all(new.nodes[n].phase is Phase.BACKWARD for n in remade)
    assert all(new.tensors[t].storage == storages[1] for n in remade for t in new.nodes[n].output_ids())
    placements = RULES.placements(new)
    assert {placements[n] for n in loads} == {Placement.HIDDEN} and placements[backs[0]] is Placement.EARLY
    assert {placements[n] for n in remade} == {Placement.LATE}
    order = rw.order
    for load, phase in zip(loads, (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER), strict=True):
        readers = [u for t in new.nodes[load].output_ids() for u in new.users(t)]
        assert all(order.index(load) < order.index(u) for u in readers)
        assert new.nodes[load].phase is phase


def test_device_memory_no_longer_holds_the_parameters_between_their_uses() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    params = sum(g.tensors[t].nbytes for t in g.inputs if g.tensors[t].role is Role.PARAM)
    offloaded, order = offload(g, g.order, RULE, Role.PARAM)
    before, after = simulate(g, g.order), simulate(offloaded, order)
    assert after.baseline_bytes == before.baseline_bytes - params
    assert after.peak_bytes < before.peak_bytes


# ------------------------------------------------------------------ same numbers as eager
OPTIMIZERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1),
    "adam-amsgrad": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, amsgrad=True),
    "sgd-momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3),
}


def eager_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...],
               fn: Callable[..., torch.Tensor] = loss_fn) -> torch.Tensor:
    loss = fn(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str, tol: float = TOL) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_parameters_state_and_gradients_on_the_host_keep_eager_numbers(name: str) -> None:
    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](model), OPTIMIZERS[name](ref)
    g, order = everything_on_host(peakcut.capture(model, batch, loss_fn, opt))
    assert {g.tensors[t].role for t in g.host_inputs()} >= {Role.PARAM}
    assert any(n.op == STORE_OP for n in g.nodes.values())
    step = peakcut.build(g, order, optimizer=opt)
    assert "parameter p_fc1_weight lives in host memory" in step.source
    for k in range(STEPS):
        assert_close(step(model, batch), eager_step(ref, ref_opt, batch), f"loss at step {k}")
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert_close(p, q, f"{pname} at step {k}")
    ours, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    for i, slots in theirs.items():
        for slot, value in slots.items():
            assert_close(ours[i][slot], value, f"state {i}.{slot}")


@pytest.mark.parametrize("name", ["bert-base", "llama2-7b", "gpt2-xl"])
def test_a_tiny_transformer_with_everything_on_the_host(name: str) -> None:
    """Tiny size, AdamW: every parameter and moment kept in host memory, every gradient
    swapped out and back. 3 steps give eager's numbers; the measured peak (CPU profiler) is
    the simulated one within the spine's 5%, below the plain step's; the host copies' measured
    peak is the simulated one."""
    inst = get_workload(name).build("tiny")
    model, ref = inst.model, copy.deepcopy(inst.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=1e-2)
    plain = peakcut.capture(model, inst.batch, inst.loss_fn, opt)
    g, order = everything_on_host(plain)
    check_graph(g)
    assert len(g.host_inputs()) == sum(1 for t in plain.inputs if plain.tensors[t].role in (Role.PARAM, Role.OPT_STATE))
    assert_tiny_plan_trains_like_eager(inst, plain, g, order, (model, opt), (ref, ref_opt))


def assert_tiny_plan_trains_like_eager(inst: WorkloadInstance, plain: Graph, g: Graph, order: list[int],
                                       ours: tuple[nn.Module, torch.optim.Optimizer],
                                       eager: tuple[nn.Module, torch.optim.Optimizer]) -> None:
    """Plan (g, order) of the captured step `plain` on a tiny workload: its simulated peak is
    below the plain step's and the measured one (CPU profiler) within the spine's 5%; STEPS
    steps give eager's loss and parameters; host buffers measured equal the simulated ones."""
    (model, opt), (ref, ref_opt) = ours, eager
    simulated = simulate(g, order).peak_bytes
    assert simulated < simulate(plain, plain.order).peak_bytes
    step = peakcut.build(g, order, optimizer=opt)
    measured = peakcut.measure(step, model, inst.batch, method="cpu-profiler", repeats=1).peak_bytes
    assert abs(simulated - measured) <= 0.05 * measured, (simulated, measured)
    tol = tolerance(torch.float32, 256, STEPS)
    for k in range(STEPS):
        assert_close(step(model, inst.batch), eager_step(ref, ref_opt, inst.batch, inst.loss_fn), f"loss {k}", tol)
    assert step.host_peak_bytes == simulated_host_peak(g, order) > 0
    for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_close(p, q, pname, tol)


def test_a_checkpoint_saved_and_loaded_around_offloaded_steps() -> None:
    """The Parameter objects stay the user's: state_dict saves them, load_state_dict writes
    into them, and the next step reads the loaded values from host memory."""
    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    captured = peakcut.capture(model, batch, loss_fn, opt)
    g, order = offload(captured, captured.order, RULE, Role.PARAM)
    step = peakcut.build(g, order, optimizer=opt)
    for _ in range(2):
        step(model, batch)
        eager_step(ref, ref_opt, batch)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    model.load_state_dict({k: torch.zeros_like(v) for k, v in saved_model.items()})
    model.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)
    step(model, batch)
    eager_step(ref, ref_opt, batch)
    for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert_close(p, q, pname)


# ------------------------------------------------------------------ the search and measurement
def test_the_search_chooses_it_under_a_memory_limit() -> None:
    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    g = peakcut.capture(model, batch, loss_fn, opt)
    found = optimize_graph(g, memory_limit=0.8, time_budget=60, max_states=40, device="rtx3090",
                           settings=MoveSettings.only("offload_param"))
    best = found.result.best
    assert {r.kind for r in best.recipes} == {"offload_param"}
    assert best.program.host_inputs()
    step = peakcut.build(best.program, list(best.order), optimizer=opt)
    for k in range(STEPS):
        assert_close(step(model, batch), eager_step(ref, ref_opt, batch), f"loss at step {k}")


def test_measured_device_memory_drops_by_the_parameters_kept_in_host_memory() -> None:
    """cpu-profiler measurement: the offloaded step's measured peak is below the plain step's
    and within the simulated one (host buffers are numpy-backed, apart from the allocator)."""
    model, batch = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = peakcut.capture(model, batch, loss_fn, opt)
    offloaded, order = offload(g, g.order, RULE, Role.PARAM)
    plain = peakcut.measure(peakcut.build(g), copy.deepcopy(model), batch,
                            method="cpu-profiler", repeats=1).peak_bytes
    kept = peakcut.measure(peakcut.build(offloaded, order), copy.deepcopy(model), batch,
                           method="cpu-profiler", repeats=1).peak_bytes
    simulated = simulate(offloaded, order).peak_bytes
    print(f"measured peak: plain {plain:,} B, offloaded {kept:,} B; simulated {simulated:,} B")
    assert kept < plain
    assert kept <= simulated


# ------------------------------------------------------------------ CUDA code (compiled, not run here)
def _cuda(g: Graph) -> Graph:
    edit = GraphEditor(g)
    edit.set_device("cuda")
    return edit.finish()


def _index(lines: list[str], pattern: str, start: int = 0) -> int:
    for i in range(start, len(lines)):
        if re.search(pattern, lines[i]):
            return i
    raise AssertionError(f"no line matching {pattern!r} after line {start}")


@pytest.mark.parametrize("with_swaps", [False, True])
def test_cuda_copies_of_host_kept_inputs_run_on_the_copy_streams(with_swaps: bool) -> None:
    """Each load copies on h2d after h2d waited for compute and records an event that compute
    waits for before the copy's first reader; each writeback copies on d2h after an event
    recorded on compute; the streams are made once and the step ends with d2h synchronised."""
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    g, order = offload(g, g.order, RULE, Role.PARAM)
    g, order = offload(g, order, STATE_RULE, Role.OPT_STATE)
    if with_swaps:
        g, order = swap_gradients(g, order)
    cuda = _cuda(g)
    source = generate_source(cuda, order)
    compile(source, "<generated>", "exec")
    lines = [line.strip() for line in source.splitlines()]
    assert sum(line.startswith("h2d = torch.cuda.Stream") for line in lines) == 1
    assert sum(line.startswith("d2h.synchronize()") for line in lines) == 1
    assert _index(lines, r"^d2h\.synchronize\(\)") > max(i for i, x in enumerate(lines) if "copy_(" in x)
    loads = [i for i, line in enumerate(lines) if "lives in host memory: copy it in" in line]
    n_loads = sum(1 for n in order if cuda.nodes[n].op == LOAD_OP and cuda.is_input_copy(cuda.nodes[n]))
    assert len(loads) == n_loads > 6
    for at in loads:
        assert lines[at].endswith("on the h2d stream")
        yn = re.match(r"^(\w+) = torch\.empty_strided\(.*device=device\)$", lines[at + 1]).group(1)
        after = _index(lines, r"^h2d\.wait_stream\(compute\)", at + 1)
        copy_line = _index(lines, rf"^{yn}\.copy_\(\w+, non_blocking=True\)$", after)
        assert lines[copy_line - 1] == "with torch.cuda.stream(h2d):"
        recorded = _index(lines, rf"^ev_{yn}\w*\.record\(h2d\)$", copy_line)
        event = lines[recorded].split(".")[0]
        waited = _index(lines, rf"^compute\.wait_event\({event}\)$", recorded)
        first_use = min(i for i in range(copy_line + 1, len(lines)) if re.search(rf"\b{yn}\b", lines[i])
                        and not lines[i].startswith((f"{yn}.record_stream", "del ")))
        assert waited < first_use, f"{yn}: read at line {first_use} before its copy is waited for"
    backs = [i for i, line in enumerate(lines) if "back to host memory, on the d2h stream" in line]
    assert len(backs) == sum(1 for n in order if cuda.nodes[n].op == WRITEBACK_OP) > 6
    for at in backs:
        assert re.match(r"^ev_\w+ = torch\.cuda\.Event\(\)$", lines[at + 1])
        assert re.match(r"^ev_\w+\.record\(compute\)$", lines[at + 2])
        assert re.match(r"^d2h\.wait_event\(ev_\w+\)$", lines[at + 3])
        assert lines[at + 4] == "with torch.cuda.stream(d2h):" and "non_blocking=True" in lines[at + 5]
    cpu_source = generate_source(g, order)
    assert "torch.cuda" not in cpu_source and "non_blocking" not in cpu_source
