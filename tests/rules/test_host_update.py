"""Updates on the host (rules/host_update_rule.py): where the rule applies and why not, the
rewrite (the update's ops on the host, its state host-kept, device inputs stored once, the new
value uploaded), eager's numbers over several steps with the parameter on the device or in host
memory, the worker thread, device and host memory, the host stream, CUDA code and the search."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen.host_worker import HostWorker
from peakcut.codegen.source import generate_source
from peakcut.codegen.swap import simulated_host_peak
from peakcut.cost.model import get_cost_model
from peakcut.ir.check import check_graph
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase
from peakcut.ir.ops import LOAD_OP, STORE_OP, UPLOAD_OP, WRITEBACK_OP
from peakcut.ir.tags import HostTag
from peakcut.ir.tensor import Role
from peakcut.memory import simulate
from peakcut.optimizer import optimize_graph
from peakcut.rules import RULES
from peakcut.rules.host_update_rule import HostUpdateRule
from peakcut.rules.hotspot import HotspotSite
from peakcut.schedule.placement import Placement, place
from peakcut.simulate import simulate_timeline
from peakcut.simulate.streams import HOST
from peakcut.transform.host_update import is_host_updated
from peakcut.workloads import get_workload
from tests.helpers import cross_entropy_loss, make_mlp
from tests.rules.test_offload_param import RULE as PARAM_RULE
from tests.rules.test_offload_param import STATE_RULE, assert_tiny_plan_trains_like_eager, offload
from tests.tolerance import tolerance

RULE = HostUpdateRule()
STEPS = 3
TOL = tolerance(torch.float32, 16, STEPS)
loss_fn = cross_entropy_loss


def site(g: Graph, tensor: int) -> HotspotSite:
    return HotspotSite(tensor, -1, (), g.tensors[tensor].nbytes, 0)


def named_input(g: Graph, name: str) -> int:
    return g.inputs[g.input_names.index(name)]


def on_host(g: Graph, order: list[int]) -> tuple[Graph, list[int]]:
    """Every parameter's update on the host, where the rule applies."""
    for t in [t for t in g.inputs if g.tensors[t].role is Role.PARAM]:
        if RULE.why_not(g, order, site(g, t)) is None:
            rw = RULE.apply(g, order, site(g, t))
            g, order = rw.graph, rw.order
    return g, order


OPTIMIZERS: dict[str, Callable[[nn.Module], torch.optim.Optimizer]] = {
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1),
    "adam-amsgrad": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, amsgrad=True),
    "sgd-momentum": lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3),
}


def eager_step(model: nn.Module, opt: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...],
               fn: Callable[..., torch.Tensor] = loss_fn, clip: float | None = None) -> torch.Tensor:
    loss = fn(model, batch)
    loss.backward()
    if clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    opt.step()
    opt.zero_grad()
    return loss.detach()


def assert_close(a: torch.Tensor, b: torch.Tensor, what: str, tol: float = TOL) -> None:
    torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


def assert_same_training(model: nn.Module, ref: nn.Module, opt: torch.optim.Optimizer,
                         ref_opt: torch.optim.Optimizer, step: Callable[..., torch.Tensor], batch: tuple,
                         clip: float | None = None, tol: float = TOL) -> None:
    for k in range(STEPS):
        assert_close(step(model, batch), eager_step(ref, ref_opt, batch, clip=clip), f"loss at step {k}", tol)
        for (pname, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert_close(p, q, f"{pname} at step {k}", tol)
    ours, theirs = opt.state_dict()["state"], ref_opt.state_dict()["state"]
    for i, slots in theirs.items():
        for slot, value in slots.items():
            assert_close(ours[i][slot], value, f"state {i}.{slot}", tol)


# ------------------------------------------------------------------ where it applies
def test_it_applies_to_updated_parameters_only() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    weight = named_input(g, "param:fc1.weight")
    assert RULE.why_not(g, g.order, site(g, weight)) is None
    moment = named_input(g, "state:fc1.weight.exp_avg")
    assert "not a parameter (opt_state)" in (RULE.why_not(g, g.order, site(g, moment)) or "")
    done = RULE.apply(g, g.order, site(g, weight)).graph
    assert is_host_updated(done, weight)
    assert "updated on the host already" in (RULE.why_not(done, done.order, site(done, weight)) or "")
    frozen, fbatch = make_mlp()
    inference = peakcut.capture(frozen, fbatch, loss_fn, None)
    w = named_input(inference, "param:fc1.weight")
    assert "not updated by the step's optimizer" in (RULE.why_not(inference, inference.order, site(inference, w)) or "")


def test_accumulated_gradients_and_grad_scalers_keep_the_update_on_the_device() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()), accumulate=True)
    weight = named_input(g, "param:fc1.weight")
    assert "accumulate=k" in (RULE.why_not(g, g.order, site(g, weight)) or "")
    scaled = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()),
                             grad_scaler=torch.amp.GradScaler("cpu"))
    weight = named_input(scaled, "param:fc1.weight")
    assert "GradScaler" in (RULE.why_not(scaled, scaled.order, site(scaled, weight)) or "")


def test_the_rewrite_runs_the_update_on_the_host() -> None:
    """The update's ops carry the host tag; its moments become host-kept inputs; the gradient
    (after clipping's norm) and the parameter are stored once; one upload writes the parameter
    back after every op of its update, and after every device reader of its old value."""
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()), max_grad_norm=1.0)
    weight = named_input(g, "param:fc2.weight")
    rw = RULE.apply(g, g.order, site(g, weight))
    new = rw.graph
    check_graph(new)
    moments = {named_input(new, "state:fc2.weight.exp_avg"), named_input(new, "state:fc2.weight.exp_avg_sq")}
    assert set(new.host_inputs()) == moments
    host_ops = [n for n in new.order if new.nodes[n].tags.on_host]
    assert host_ops and all(new.nodes[n].phase is Phase.OPTIMIZER for n in host_ops)
    assert {new.nodes[n].op for n in host_ops} >= {"aten.lerp_.Scalar", "aten.addcdiv_.default", "aten.sqrt.default"}
    stores = [n for n in rw.added if new.nodes[n].op == STORE_OP]
    stored = {new.nodes[n].input_tuple[0] for n in stores}
    grads = [t for t in stored if (p := new.producer(t)) is not None and new.nodes[p].phase is Phase.BACKWARD]
    assert weight in stored and grads
    (upload,) = [n for n in rw.added if new.nodes[n].op == UPLOAD_OP]
    assert new.nodes[upload].input_tuple[0] == weight
    order = rw.order
    assert all(order.index(n) < order.index(upload) for n in host_ops)
    readers = [u for u in new.users(weight) if not new.nodes[u].tags.get(HostTag)]
    assert readers and all(order.index(u) < order.index(upload) for u in readers)
    assert {RULES.placements(new)[n] for n in (*stores, upload)} == {Placement.EARLY}
    # on the device: no moment, and no update temporaries
    assert simulate(new, order).baseline_bytes == simulate(g, g.order).baseline_bytes - sum(
        g.tensors[m].nbytes for m in moments)


def test_a_parameter_kept_in_host_memory_is_updated_there_without_copies() -> None:
    """After offload_param and offload_state, the update reads and writes the host tensors:
    its loads and writebacks go, the forward and backward loads run before its writes."""
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    g, order = offload(g, g.order, PARAM_RULE, Role.PARAM)
    g, order = offload(g, order, STATE_RULE, Role.OPT_STATE)
    weight = named_input(g, "param:fc2.weight")
    rw = RULE.apply(g, order, site(g, weight))
    new = rw.graph
    check_graph(new)
    copies = [n for n in new.order if new.nodes[n].op in (LOAD_OP, WRITEBACK_OP)
              and new.nodes[n].input_tuple[0] in {weight, named_input(new, "state:fc2.weight.exp_avg")}]
    assert [new.nodes[n].phase for n in copies] == [Phase.FORWARD, Phase.BACKWARD]   # no update copies
    assert not any(new.nodes[n].op == UPLOAD_OP for n in rw.added)
    writers = [n for n in new.storage_writers(new.tensors[weight].storage)]
    assert writers and all(new.nodes[n].tags.on_host for n in writers)
    assert all(set(copies) <= set(new.control.get(w, ())) for w in writers)


# ------------------------------------------------------------------ same numbers as eager
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("where", ["device", "host"])
def test_updates_on_the_host_keep_eager_numbers(name: str, where: str) -> None:
    """Every update on the host, with clipping; the parameters on the device (their new values
    uploaded) or kept in host memory with their state (offload rules first)."""
    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](model), OPTIMIZERS[name](ref)
    g = peakcut.capture(model, batch, loss_fn, opt, max_grad_norm=1.0)
    order = list(g.order)
    if where == "host":
        g, order = offload(g, order, PARAM_RULE, Role.PARAM)
        g, order = offload(g, order, STATE_RULE, Role.OPT_STATE)
    g, order = on_host(g, order)
    assert all(is_host_updated(g, t) for t in g.inputs if g.tensors[t].role is Role.PARAM)
    step = peakcut.build(g, order, optimizer=opt)
    assert "host_ops.run(" in step.source and "host_ops.join()" in step.source
    assert_same_training(model, ref, opt, ref_opt, step, batch, clip=1.0)
    # device memory as simulated; host buffers as simulated (inline on CPU)
    measured = peakcut.measure(step, model, batch, method="cpu-profiler", repeats=1).peak_bytes
    assert measured == simulate(g, order).peak_bytes
    assert step.host_peak_bytes == simulated_host_peak(g, order) > 0


def test_the_worker_thread_gives_the_same_numbers() -> None:
    """What runs on CUDA: the host ops on a worker thread, in order, beside the main thread."""
    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS["adamw"](model), OPTIMIZERS["adamw"](ref)
    g, order = on_host(*_captured(model, batch, opt))
    step = peakcut.build(g, order, optimizer=opt)
    step.host_ops = HostWorker(threaded=True, buffers=step.host)
    assert_same_training(model, ref, opt, ref_opt, step, batch)


def _captured(model: nn.Module, batch: tuple, opt: torch.optim.Optimizer) -> tuple[Graph, list[int]]:
    g = peakcut.capture(model, batch, loss_fn, opt)
    return g, list(g.order)


def test_an_error_on_the_worker_is_raised_by_the_step() -> None:
    worker = HostWorker(threaded=True)
    first = worker.run(torch.ops.aten.add.Tensor, torch.ones(2), torch.ones(3))    # shapes differ
    worker.run(torch.ops.aten.neg.default, first)
    with pytest.raises(RuntimeError, match="size of tensor"):
        worker.join()
    worker.join()   # reported once


def test_a_checkpoint_round_trip_puts_host_kept_state_back_in_host_memory() -> None:
    """load_state_dict puts the moments beside their (device) parameter; the next step moves
    them to host memory again and trains on from the loaded values."""
    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS["adamw"](model), OPTIMIZERS["adamw"](ref)
    g, order = on_host(*_captured(model, batch, opt))
    step = peakcut.build(g, order, optimizer=opt)
    for _ in range(2):
        step(model, batch)
        eager_step(ref, ref_opt, batch)
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    opt.load_state_dict(saved_opt)
    model.load_state_dict(saved_model)
    assert_same_training(model, ref, opt, ref_opt, step, batch)


@pytest.mark.parametrize("name", ["bert-base", "llama2-7b", "gpt2-xl"])
def test_a_tiny_transformer_with_its_update_on_the_host(name: str) -> None:
    """Tiny size, AdamW: every parameter and its moments kept in host memory and updated there
    (offload_param, offload_state, host_update), gradients copied out once made. 3 steps give
    eager's numbers; the measured device peak (CPU profiler) is the simulated one within the
    spine's 5%, below the plain step's; host buffers measured equal the simulated ones."""
    inst = get_workload(name).build("tiny")
    model, ref = inst.model, copy.deepcopy(inst.model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=1e-2)
    plain = peakcut.capture(model, inst.batch, inst.loss_fn, opt)
    g, order = offload(plain, plain.order, PARAM_RULE, Role.PARAM)
    g, order = offload(g, order, STATE_RULE, Role.OPT_STATE)
    g, order = on_host(g, order)
    check_graph(g)
    params = [t for t in g.inputs if g.tensors[t].role is Role.PARAM]
    assert all(is_host_updated(g, t) for t in params)
    assert not any(g.nodes[n].op in (WRITEBACK_OP, UPLOAD_OP) for n in order)
    assert_tiny_plan_trains_like_eager(inst, plain, g, order, (model, opt), (ref, ref_opt))


# ------------------------------------------------------------------ the host stream
def test_on_a_gpu_profile_the_update_runs_on_the_host_stream_beside_the_device() -> None:
    """Analytic H100: the host ops run on the host stream, priced on the host's profile, while
    the device goes on; the step's latency is no more than eager's plus the host work."""
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()))
    new, order = on_host(g, list(g.order))
    cost = get_cost_model("h100")
    timeline = simulate_timeline(new, order, cost)
    host = [n for n in order if new.nodes[n].tags.on_host]
    assert {timeline.stream_of(n) for n in host} == {HOST}
    assert all(cost.node_seconds(new, n) == cost.host.node_seconds(new, n) != cost.node_seconds(g, n)
               for n in host if new.nodes[n].op == "aten.addcdiv_.default")
    ends = sorted(timeline.end_of(n) for n in host)
    assert all(a <= b for a, b in zip(ends, ends[1:], strict=False))   # in order, one stream
    cpu = get_cost_model("cpu", cpu_threads=2)
    inline = simulate_timeline(new, order, cpu)
    assert set(inline.stream) == {"compute"}


# ------------------------------------------------------------------ CUDA code (compiled, not run here)
def test_cuda_code_stores_waits_and_uploads_in_order() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()), max_grad_norm=1.0)
    g, order = on_host(g, list(g.order))
    edit = GraphEditor(g)
    edit.set_device("cuda")
    cuda = edit.finish()
    source = generate_source(cuda, order)
    compile(source, "<generated>", "exec")
    lines = [line.strip() for line in source.splitlines()]
    assert sum(line.startswith("d2h = torch.cuda.Stream") for line in lines) == 1
    stored = [re.match(r"^(ev_\w+_stored)\.record\(d2h\)$", x).group(1) for x in lines
              if re.match(r"^ev_\w+_stored\.record\(d2h\)$", x)]
    n_stores = sum(1 for n in order if cuda.nodes[n].op == STORE_OP)
    assert len(stored) == n_stores > 6
    for event in stored:      # each copy is waited for once, by the first host op reading it
        waits = [i for i, x in enumerate(lines) if "host_ops.run(" in x and re.search(rf"after=\(.*\b{event}\b", x)]
        assert len(waits) == 1 and waits[0] > lines.index(f"{event}.record(d2h)")
    uploads = [i for i, x in enumerate(lines) if x.startswith("host_ops.upload(")]
    assert len(uploads) == 6
    for at in uploads:
        event = re.match(r"^host_ops\.upload\(\w+, \w+, h2d, (ev_\w+)\)$", lines[at]).group(1)
        assert lines[at - 1] == f"{event}.record(compute)"
    join = lines.index("host_ops.join()  # the updates on the host are done")
    assert join > max(uploads) and lines[join + 1].startswith("h2d.synchronize()")


def test_cuda_host_writes_wait_for_the_h2d_loads_of_what_they_write() -> None:
    """Parameters kept in host memory and updated there: the forward and backward read them
    through copies on the h2d stream, so the first host op that writes one (placed early, as
    the search places it) waits for an event recorded on h2d after every load of it."""
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters(), weight_decay=0.1))
    g, order = offload(g, list(g.order), PARAM_RULE, Role.PARAM)
    g, order = offload(g, order, STATE_RULE, Role.OPT_STATE)
    g, order = on_host(g, order)
    order = place(g, order, get_cost_model("h100"), placements=RULES.placements(g))
    edit = GraphEditor(g)
    edit.set_device("cuda")
    source = generate_source(edit.finish(), order)
    compile(source, "<generated>", "exec")
    lines = [line.strip() for line in source.splitlines()]
    written = 0
    for name in {m.group(1) for x in lines if (m := re.search(r"host_ops\.run\(aten\.\w+\.\w+, (p_\w+),", x))}:
        first = next(i for i, x in enumerate(lines) if re.search(rf"host_ops\.run\(aten\.\w+\.\w+, {name},", x))
        loads = [i for i, x in enumerate(lines) if x == f"{name}" or f".copy_({name}, non_blocking=True)" in x]
        fence = re.search(r"after=\(.*\b(ev_h2d_loads_issued\w*)\b", lines[first])
        assert loads and fence, (name, lines[first])
        assert max(loads) < lines.index(f"{fence.group(1)}.record(h2d)") < first
        written += 1
    assert written == 6


# ------------------------------------------------------------------ in the search
def test_the_search_moves_updates_to_the_host_under_a_tight_memory_limit() -> None:
    """Analytic H100: at 60% of eager's peak, optimizer state is what must go; the plan found
    runs some updates on the host and gives eager's numbers."""
    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS["adamw"](model), OPTIMIZERS["adamw"](ref)
    g = peakcut.capture(model, batch, loss_fn, opt)
    found = optimize_graph(g, memory_limit=0.6, device="h100", time_budget=20, seed=0, max_states=150)
    kinds = {r.kind for r in found.best.recipes}
    assert "host_update" in kinds, kinds
    assert found.report["feasible"]
    step = peakcut.build(found.best.program, found.best.order, optimizer=opt)
    assert_same_training(model, ref, opt, ref_opt, step, batch)


# ------------------------------------------------------------------ batched
@pytest.mark.parametrize("rule", [RULE, STATE_RULE, PARAM_RULE], ids=["host_update", "offload_state", "offload_param"])
def test_many_sites_in_one_edit_make_the_program_one_at_a_time_makes(rule) -> None:
    """apply_many (the search's bulk move, and the replay of a run of recipes) gives the
    program applying the sites one by one gives: the same computation, peak and latency."""
    from peakcut.optimizer.state import computation_hash

    model, batch = make_mlp()
    g = peakcut.capture(model, batch, loss_fn, torch.optim.AdamW(model.parameters()), max_grad_norm=1.0)
    role = Role.OPT_STATE if rule is STATE_RULE else Role.PARAM
    sites = [site(g, t) for t in g.inputs if g.tensors[t].role is role]
    sites.append(site(g, named_input(g, "batch:0")))                       # refused, and said why
    one, order = g, list(g.order)
    for s in sites[:-1]:
        rw = rule.apply(one, order, s)
        one, order = rw.graph, rw.order
    many, reasons = rule.apply_many(g, g.order, sites)
    assert many is not None and reasons[:-1] == [None] * (len(sites) - 1) and reasons[-1]
    check_graph(many.graph)
    assert computation_hash(many.graph, many.order) == computation_hash(one, order)
    cost = get_cost_model("h100")
    placed = [place(h, o, cost, placements=RULES.placements(h)) for h, o in ((many.graph, many.order), (one, order))]
    a, b = simulate_timeline(many.graph, placed[0], cost), simulate_timeline(one, placed[1], cost)
    assert (a.peak_bytes, a.latency_seconds) == pytest.approx((b.peak_bytes, b.latency_seconds))


def test_the_search_offers_updates_on_the_host_after_the_state_went_there() -> None:
    """Bulk moves: every moment kept in host memory is one move; on top of it the updates can
    still go to the host (freeing nothing more at the peak, saving the moments' copies), as
    one move again, and that is faster on the H100 profile."""
    import random

    from peakcut.optimizer.children import MoveSettings, children

    inst = get_workload("llama2-7b").build("tiny")      # 21 parameters: more than a hot-spot move takes
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    found = optimize_graph(g, time_budget=0.3, max_states=1, device="h100")
    deriver, root = found.deriver, found.result.root
    rng = random.Random(0)
    bulk = {m.kind: m for m in children(root, deriver, MoveSettings(), rng) if "of its sites at once" in m.description}
    assert set(bulk) == {"offload_state", "offload_param", "host_update"}
    offloaded = bulk["offload_state"].build()
    assert [r.kind for r in offloaded.recipes] == ["offload_state"] * 42
    then = {m.kind: m for m in children(offloaded, deriver, MoveSettings(), rng)
            if "of its sites at once" in m.description or m.description.startswith("undo")}
    assert "host_update" in then and then["undo"].description == "undo: offload_state at all 42 of its sites"
    moved = then["host_update"].build()
    assert moved.peak_bytes <= offloaded.peak_bytes and moved.latency_s < offloaded.latency_s


def test_keeping_a_host_updated_parameter_in_host_memory_drops_its_two_copies() -> None:
    """offload_param after host_update (the parameter on the device: stored, updated on the
    host, uploaded) makes the program host_update after offload_param makes: the update reads
    and writes the host tensor, no store or upload of the parameter is left; eager's numbers."""
    from peakcut.optimizer.state import computation_hash

    model, batch = make_mlp()
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS["adamw"](model), OPTIMIZERS["adamw"](ref)
    g = peakcut.capture(model, batch, loss_fn, opt, max_grad_norm=1.0)
    params = [site(g, t) for t in g.inputs if g.tensors[t].role is Role.PARAM]
    updated, _ = RULE.apply_many(g, g.order, params)
    then_kept, reasons = PARAM_RULE.apply_many(updated.graph, updated.order, params)
    assert then_kept is not None and reasons == [None] * len(params)
    new = then_kept.graph
    check_graph(new)
    assert not any(n.op == UPLOAD_OP or (n.op == STORE_OP and n.input_tuple[0] in new.inputs)
                   for n in new.nodes.values())
    kept_first, _ = PARAM_RULE.apply_many(g, g.order, params)
    other, _ = RULE.apply_many(kept_first.graph, kept_first.order, params)
    assert computation_hash(new, then_kept.order) == computation_hash(other.graph, other.order)
    step = peakcut.build(new, then_kept.order, optimizer=opt)
    assert_same_training(model, ref, opt, ref_opt, step, batch, clip=1.0)


def test_a_batch_failing_in_the_loss_leaves_parameters_and_state_as_they_were() -> None:
    """The update's ops keep their edges after the loss: none of them (weight decay,
    beta2 * exp_avg_sq, which need no gradient) runs before a label out of range fails."""
    model, batch = make_mlp()
    opt = OPTIMIZERS["adamw"](model)
    g, order = on_host(*_captured(model, batch, opt))
    order = place(g, order, get_cost_model("h100"), placements=RULES.placements(g))   # all EARLY
    step = peakcut.build(g, order, optimizer=opt)
    step(model, batch)
    before = [t.clone() for t in (*model.parameters(), *step.state.values())]
    with pytest.raises((IndexError, RuntimeError)):
        step(model, (batch[0], torch.full_like(batch[1], 99)))
    after = [*model.parameters(), *step.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
