"""Verification checks numbers (peakcut.optimizer.numbers): a candidate plan's first step
against the user's eager step, from the same parameters, optimizer state and RNG.

A plan made wrong on purpose (one parameter's gradient scaled by 1.5 before the update, by a
GraphEditor edit of its graph) is rejected, with the value, the difference and the allowance
in the report; when every candidate is wrong, optimize raises LimitNotMet saying so. Correct
plans pass: with dropout (the RNG replayed), under bf16 autocast, with a split reduction, and
a gradient that is rounding noise passes too. The report states the check's memory cost, and
nothing of the check stays on the model, the optimizer or the plan.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
import torch
from torch import nn

import peakcut
import peakcut.optimizer.verify as verify_module
from peakcut.codegen.program import Step
from peakcut.cost.measured import MeasuredCostModel
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.node import Phase, TensorRef
from peakcut.ir.tensor import Role
from peakcut.optimizer import LimitNotMet, optimize_graph
from peakcut.optimizer.children import MoveSettings
from peakcut.optimizer.numbers import (
    Fingerprint,
    StepNumbers,
    allowances,
    float32_math,
    judge,
    tolerance_for,
)
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.user_step import Restore
from peakcut.optimizer.verify import MIN_ROUNDS, EagerStep, verify
from tests.helpers import cross_entropy_loss, make_mlp

BUDGET = 6.0


def scaled_gradient(g: Graph, order: list[int], param: str, factor: float) -> tuple[Graph, list[int]]:
    """`g` with the gradient of `param` multiplied by `factor` before anything reads it."""
    shape = g.tensors[g.inputs[g.input_names.index(f"param:{param}")]].shape
    (grad,) = [t.id for t in g.tensors_with_role(Role.GRAD) if t.shape == shape]
    readers = g.users(grad)
    ed = GraphEditor(g)
    mul = ed.add_op("aten.mul.Tensor", (TensorRef(grad), factor), {}, name="scaled_on_purpose",
                    phase=Phase.BACKWARD, module="")
    for reader in readers:
        ed.rewire(reader, {grad: mul.outputs[0]})
    position = min(order.index(r) for r in readers)
    ed.set_order([*order[:position], mul.id, *order[position:]])
    wrong = ed.finish()
    return wrong, list(wrong.order)


class ScaledGradient(Step):
    """A candidate whose fc1.weight gradient is 1.5 times what it should be."""

    def __init__(self, graph: Graph, order: list[int] | None = None, **kw: Any) -> None:
        super().__init__(*scaled_gradient(graph, list(graph.order if order is None else order), "fc1.weight", 1.5),
                         **kw)


class DropoutMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(32, 64), nn.Dropout(0.5), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def _bf16_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return cross_entropy_loss(model, batch)


def _measured(tmp_path: Any, model: nn.Module, batch: Any, loss_fn: Any, opt: Any) -> MeasuredCostModel:
    """A measured cost model with the step's calls measured already (the search keeps its budget)."""
    cost = MeasuredCostModel("cpu", cache_dir=tmp_path)
    cost.profile(peakcut.capture(model, batch, loss_fn, opt))
    return cost


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_a_plan_with_one_gradient_scaled_is_rejected_with_the_reason(kind: str) -> None:
    """SGD shows the scaled gradient in the update, AdamW (whose first update does not see a
    gradient's scale) in exp_avg; the correct plan beside it matches and is timed."""
    model, batch = make_mlp()
    opt = (torch.optim.SGD(model.parameters(), lr=0.1) if kind == "sgd"
           else torch.optim.AdamW(model.parameters(), lr=1e-3))
    g = peakcut.capture(model, batch, cross_entropy_loss, opt)
    wrong = Step(*scaled_gradient(g, list(g.order), "fc1.weight", 1.5))
    eager = EagerStep(model, batch, cross_entropy_loss, opt, None)
    verdict = verify([("right", Step(g, g.order)), ("scaled", wrong)], model, batch, eager, opt,
                     Objective("latency", 1.0), 1e-3, MIN_ROUNDS)
    assert [c.name for c in verdict.candidates] == ["right"]           # the wrong one is not timed
    numbers = verdict.report("latency")["numbers"]
    right, scaled = numbers["candidates"]
    assert right["matches"] and right["worst"] <= 1.0
    assert not scaled["matches"] and scaled["worst"] > 100
    (rejected,) = numbers["rejected"]
    where = "update of fc1.weight" if kind == "sgd" else "change of optimizer state fc1.weight.exp_avg"
    assert rejected["name"] == "scaled" and rejected["why"].startswith(where), rejected
    assert "differs by" in rejected["why"] and "allowed" in rejected["why"]
    memory = numbers["memory"]                     # the check's cost, stated
    assert memory["fingerprint_bytes"] == 2 * (24 * numbers["values"] + 8) and memory["transient_host_bytes"] > 0
    assert memory["snapshot_bytes"] == 0 and memory["entry_snapshot_bytes"] > 0 and "host memory" in memory["text"]
    json.dumps(numbers)


@pytest.mark.parametrize("last_wrong", [False, True])
def test_the_last_matching_candidates_step_stands_in_for_eagers_warm_up(last_wrong: bool) -> None:
    """After the numbers check the state is the last candidate's step where it matched (one
    AdamW step past the entry, as a warm-up step of eager's leaves it: state made, grads None),
    else the entry state again; Restore puts the entry back either way."""
    model, batch = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = peakcut.capture(model, batch, cross_entropy_loss, opt)
    entry = [p.detach().clone() for p in model.parameters()]
    reference = copy.deepcopy(model)
    EagerStep(reference, batch, cross_entropy_loss, torch.optim.AdamW(reference.parameters(), lr=1e-2), None)()
    last = Step(*scaled_gradient(g, list(g.order), "fc1.weight", 1.5)) if last_wrong else Step(g, g.order)
    candidates = [("right", Step(g, g.order)), ("last", last)]
    for _, step in candidates:                 # the user's optimizer, as verify attaches it
        step.update.attach(opt)
    eager = EagerStep(model, batch, cross_entropy_loss, opt, None)
    with Restore(model, opt) as restore:
        numbers = verify_module._check_numbers(candidates, model, batch, eager, opt, restore,
                                               verify_module._rng_state(torch.device("cpu")))
        assert numbers.stepped is not last_wrong
        after = reference.parameters() if numbers.stepped else entry
        for p, want in zip(model.parameters(), after, strict=True):
            torch.testing.assert_close(p.detach(), want.detach())
            assert p.grad is None
        assert bool(opt.state) is numbers.stepped
    for p, want in zip(model.parameters(), entry, strict=True):
        assert torch.equal(p.detach(), want)


def test_every_candidate_wrong_raises_limit_not_met_saying_so(tmp_path, monkeypatch) -> None:
    model, batch = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cost = _measured(tmp_path, model, batch, cross_entropy_loss, opt)
    monkeypatch.setattr(verify_module, "Step", ScaledGradient)
    with pytest.raises(LimitNotMet, match="no candidate plan can be kept") as err:
        peakcut.optimize(model, batch, cross_entropy_loss, opt, latency_limit=1.1, time_budget=BUDGET,
                         device=cost, settings=MoveSettings.only("remat"))
    message = str(err.value)
    assert "the untransformed step too" in message and "update of fc1.weight" in message
    measured = err.value.measured
    assert measured is not None and measured["chosen"] is None and not measured["candidates"]
    rejected = {r["name"] for r in measured["numbers"]["rejected"]}
    assert "untransformed step" in rejected


def _optimized(tmp_path: Any, model: nn.Module, batch: Any, loss_fn: Any, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """optimize under the default latency limit on a measured cost model; its numbers report."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    plan = peakcut.optimize(model, batch, loss_fn, opt, latency_limit=1.1, time_budget=BUDGET,
                            device=_measured(tmp_path, model, batch, loss_fn, opt))
    numbers = plan.report["verification"]["numbers"]
    assert numbers["candidates"] and all(c["matches"] for c in numbers["candidates"]), numbers
    assert not numbers["rejected"]
    # nothing of the check stays behind: values, RNG, hooks, state; the report is plain data
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert torch.equal(torch.get_rng_state(), rng) and not opt.state
    assert all(p.grad is None and not p._backward_hooks for p in model.parameters())
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    json.dumps(plan.report)
    assert torch.isfinite(plan.step(batch))
    return numbers


def test_a_correct_plan_with_dropout_matches(tmp_path) -> None:
    torch.manual_seed(0)
    model, batch = DropoutMLP(), (torch.randn(64, 32), torch.randint(0, 8, (64,)))
    numbers = _optimized(tmp_path, model, batch, cross_entropy_loss, torch.optim.AdamW(model.parameters()))
    assert numbers["tolerance"]["dtypes"] == ["float32"]


def test_a_correct_plan_under_bf16_autocast_matches(tmp_path) -> None:
    model, batch = make_mlp()
    numbers = _optimized(tmp_path, model, batch, _bf16_loss,
                         torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert numbers["tolerance"]["dtypes"] == ["float32", "bfloat16"]
    assert numbers["tolerance"]["relative"] < 0.5 / 2     # a gradient scaled by 1.5 is off by 0.5: caught


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16 autocast"])
def test_plans_that_split_the_batch_match(autocast: bool) -> None:
    """Fission splits the weight gradients' reductions over the batch: rounding differs from
    eager's, within the tolerance; a gradient scaled by 1.5 in the same plan does not pass."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.LayerNorm(128), nn.GELU(), nn.Linear(128, 10))
    batch = (torch.randn(256, 64), torch.randint(0, 10, (256,)))
    loss_fn = _bf16_loss if autocast else cross_entropy_loss
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = peakcut.capture(model, batch, loss_fn, opt)
    found = optimize_graph(g, memory_limit=0.3, device="cpu", time_budget=1.0, settings=MoveSettings.only("fission"))
    split = found.best
    assert split.fission(), "no batch split found"
    wrong = Step(*scaled_gradient(split.program, list(split.order), "0.weight", 1.5))
    eager = EagerStep(model, batch, loss_fn, opt, None)
    verdict = verify([("split", Step(split.program, list(split.order))), ("split, scaled", wrong)], model, batch,
                     eager, opt, Objective("memory", float(1 << 40)), 1e-3, 1)
    assert verdict.numbers is not None
    split_j, wrong_j = verdict.numbers.judged
    assert split_j.matches and split_j.worst < 0.1, split_j
    assert not wrong_j.matches and "0.weight" in wrong_j.why


def _numbers(values: dict[str, tuple[float, float, float, int]], loss: float = 1.0) -> StepNumbers:
    return StepNumbers(loss, {k: Fingerprint(n, 1, s, norm, dot) for k, (s, norm, dot, n) in values.items()}, 0)


def test_a_gradient_that_is_rounding_noise_passes_and_a_scaled_one_does_not() -> None:
    """An attention key's bias has a gradient that is zero up to rounding: eager's and a
    plan's are different noise. It is judged against its neighbours' size, not its own."""
    n = 64
    normal = {f"grad:b{i}": (1.0 * i, 8.0 * (1 + i / 10), 2.0 * i, n) for i in range(5)}
    ref = _numbers({**normal, "grad:key.bias": (1e-7, 3e-7, -2e-7, n)})
    relative = 1e-4
    allowed = allowances(ref, relative)
    noise = _numbers({**normal, "grad:key.bias": (-4e-7, 5e-7, 6e-7, n)})
    assert judge(0, "noise", ref, noise, allowed, relative).matches
    f = ref.values["grad:b2"]
    assert f is not None
    scaled = _numbers({**normal, "grad:key.bias": (1e-7, 3e-7, -2e-7, n), "grad:b2": (1.5 * f.sum, 1.5 * f.norm,
                                                                                       1.5 * f.dot, n)})
    j = judge(1, "scaled", ref, scaled, allowed, relative)
    assert not j.matches and j.why.startswith("gradient of b2, norm")
    lost = _numbers({**normal, "grad:key.bias": (math.nan, math.nan, math.nan, n)})
    assert "eager's" in judge(2, "nan", ref, lost, allowed, relative).why


def test_adams_update_of_a_noise_gradient_is_not_judged() -> None:
    """Adam divides by sqrt(exp_avg_sq): where the gradient is rounding noise, so is the update
    (about lr, either sign), in eager too; its exp_avg is judged and carries the gradient."""
    n = 64
    moments = {f"state:w{i}.exp_avg": (0.0, 1.0, 0.1, n) for i in range(4)}
    squares = {f"state:w{i}.exp_avg_sq": (0.1, 0.01, 0.0, n) for i in range(4)}
    updates = {f"param:w{i}": (0.0, 0.008, 0.001, n) for i in range(4)}
    ref = _numbers({**moments, **squares, **updates, "state:w0.exp_avg": (0.0, 1e-9, 0.0, n)})
    allowed = allowances(ref, 1e-4)
    assert allowed["param:w0"] is None                       # its gradient is noise: so is its update
    assert allowed["param:w1"] is not None and allowed["param:w1"] < 0.5 * 0.008   # others are judged


def test_the_tolerance_follows_the_step_dtypes() -> None:
    model, batch = make_mlp()
    g32 = peakcut.capture(model, batch, cross_entropy_loss, None)
    gbf = peakcut.capture(model, batch, _bf16_loss, None)
    assert tolerance_for([g32]).dtypes == ("float32",) and tolerance_for([g32]).relative < 1e-3
    mixed = tolerance_for([gbf])
    assert mixed.dtypes == ("float32", "bfloat16") and 0.05 < mixed.relative < 0.25
    assert float32_math(torch.device("cpu")) is None          # float32 matmul precision "highest"
    tf32 = tolerance_for([g32], torch.float16)                 # TF32: float16's mantissa
    assert tf32.dtypes == ("float32", "float16 (float32 math)") and 1e-3 < tf32.relative < mixed.relative


def test_gradients_without_an_optimizer_are_compared() -> None:
    model, batch = make_mlp()
    g = peakcut.capture(model, batch, cross_entropy_loss, None)
    eager = EagerStep(model, batch, cross_entropy_loss, None, None)
    grad = g.outputs[g.output_names.index("grad:fc2.bias")]
    ed = GraphEditor(g)                                   # the returned gradient doubled
    mul = ed.add_op("aten.mul.Tensor", (TensorRef(grad), 2.0), {}, name="doubled", phase=Phase.BACKWARD, module="")
    ed.set_interface(outputs=[mul.outputs[0] if t == grad else t for t in g.outputs])
    ed.insert_in_order(len(g.order), [mul.id])
    doubled = ed.finish()
    verdict = verify([("right", Step(g, g.order)), ("doubled", Step(doubled, list(doubled.order)))], model, batch,
                     eager, None, Objective("memory", float(1 << 40)), 1e-3, 1)
    assert verdict.numbers is not None
    right, wrong = verdict.numbers.judged
    assert right.matches and wrong.why.startswith("gradient of fc2.bias")
    assert all(p.grad is None for p in model.parameters())


CALLS = torch.zeros(())


def _counting_loss(m: torch.nn.Module, b: tuple[torch.Tensor]) -> torch.Tensor:
    CALLS.add_(1)             # a global the step writes in place: a const: input
    return m(b[0]).pow(2).mean() * (1 + 0 * CALLS)


def test_a_tensor_the_step_writes_in_place_is_put_back_and_not_held_against_a_plan() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    CALLS.zero_()
    plan = peakcut.optimize(model, (torch.randn(8, 4),), _counting_loss, opt, device="measured",
                            latency_limit=1.2, time_budget=20)
    numbers = plan.report["verification"]["numbers"]
    assert not numbers["rejected"], numbers["rejected"]
    assert float(CALLS) == 0.0                 # verification trains nothing, counters included


def test_the_checks_time_is_priced_for_the_values_it_fingerprints() -> None:
    """optimize keeps time for the numbers check's fingerprints (check_seconds): a step's
    parameters, buffers and AdamW moments, timed here."""
    from peakcut.optimizer.numbers import CHANGED_INPUTS, check_seconds

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.Linear(256, 8))
    batch = (torch.randn(16, 64), torch.randint(0, 8, (16,)))
    g = peakcut.capture(model, batch, cross_entropy_loss, torch.optim.AdamW(model.parameters()))
    changed = [n for n in g.input_names if n.startswith(CHANGED_INPUTS)]
    assert any(n.startswith("state:") for n in changed) and any(n.startswith("buffer:") for n in changed)
    assert check_seconds(g) > 0


def test_the_check_prices_no_fingerprint_of_a_frozen_parameter() -> None:
    """A frozen parameter (a LoRA model's base weights) is neither updated nor fingerprinted:
    checked_values counts the trainable parameters, their AdamW state and the buffers."""
    from peakcut.optimizer.numbers import checked_values

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.Linear(256, 8))
    model[0].requires_grad_(False)
    batch = (torch.randn(16, 64), torch.randint(0, 8, (16,)))
    trainable = [p for p in model.parameters() if p.requires_grad]
    g = peakcut.capture(model, batch, cross_entropy_loss, torch.optim.AdamW(trainable))
    weights = sum(p.numel() for p in trainable)
    buffers = sum(b.numel() for b in model.buffers())
    assert checked_values(g) == 3 * weights + buffers         # each weight, its exp_avg and exp_avg_sq


def test_a_fingerprint_over_several_chunks_is_the_values_sum_norm_and_a_sign_probe() -> None:
    """fingerprint works CHUNK values at a time: its sum and norm are the float64 ones of
    value - before; its probe is +-1 per value (a vector of ones gives a sum of signs within
    PROBE_SIGMAS standard deviations of zero), the same for one name and linear in the value;
    a permutation across chunks (the sum and norm kept) moves the dot product."""
    from peakcut.optimizer.numbers import CHUNK, PROBE_SIGMAS, fingerprint

    n = 2 * CHUNK + CHUNK // 2 + 3
    g = torch.Generator().manual_seed(0)
    value, before = torch.randn(n, generator=g), torch.randn(n, generator=g)
    f, used = fingerprint(value.view(-1, 1), "param:w", before.view(-1, 1))
    diff = value.double() - before.double()
    length = float(diff.norm())
    assert (f.numel, f.ndim) == (n, 2) and used > 0
    assert math.isclose(f.sum, float(diff.sum()), rel_tol=0, abs_tol=1e-9 * length * math.sqrt(n))
    assert math.isclose(f.norm, length, rel_tol=1e-12)
    signs = fingerprint(torch.ones(n), "param:w")[0].dot
    assert float(signs).is_integer() and abs(signs) < PROBE_SIGMAS * math.sqrt(n)
    a, b = fingerprint(value, "param:w")[0], fingerprint(before, "param:w")[0]
    both = fingerprint(value + before, "param:w")[0]
    assert math.isclose(both.dot, a.dot + b.dot, rel_tol=0, abs_tol=1e-6 * math.sqrt(n))
    flipped = fingerprint(value.flip(0), "param:w")[0]
    assert math.isclose(flipped.norm, a.norm, rel_tol=1e-12)
    assert abs(flipped.dot - a.dot) > PROBE_SIGMAS * 1e-6 * a.norm
