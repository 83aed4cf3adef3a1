"""Bad input, as a user meets it: each case gets a clear error that names what is wrong,
or works; after every error the parameters and the optimizer state are what they were
before the failing call (issue 19, item 3)."""

from __future__ import annotations

import copy
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import peakcut
from peakcut.codegen import StepBindingError
from peakcut.ir import GraphError
from peakcut.ir.tags import FissionTag, RematTag
from peakcut.optimizer.objective import LimitError
from tests.helpers import cross_entropy_loss as loss_fn
from tests.helpers import make_mlp

FAST = {"device": "h200", "time_budget": 0.5}


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers(), *state)]


def _trained() -> tuple[nn.Module, torch.optim.Optimizer, tuple[torch.Tensor, torch.Tensor]]:
    """A model and AdamW one eager step in (so there is state to leave alone)."""
    model, batch = make_mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    loss_fn(model, batch).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt, batch


def _fails_cleanly(call: Callable[[nn.Module, torch.optim.Optimizer, Any], Any], error: type[Exception] |
                   tuple[type[Exception], ...], match: str, model: nn.Module | None = None) -> None:
    trained, opt, batch = _trained()
    if model is not None:
        trained, opt = model, torch.optim.AdamW(model.parameters())
    before = _snapshot(trained, opt)
    with pytest.raises(error, match=match):
        call(trained, opt, batch)
    after = _snapshot(trained, opt)
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        return y * 2 if y.sum() > 0 else y


class ThroughNumpy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.from_numpy(x.detach().numpy()))


@pytest.mark.parametrize(("model", "match"), [
    (DataDependent, r"DataDependent.*data-dependent operation aten\._local_scalar_dense"),
    (ThroughNumpy, r"ThroughNumpy.*numpy"),
])
def test_models_that_cannot_be_traced_are_named(model: type[nn.Module], match: str) -> None:
    _fails_cleanly(lambda m, o, b: peakcut.optimize(m, b, loss_fn, o, **FAST), peakcut.CaptureError, match,
                   model=model())


@pytest.mark.parametrize(("limits", "match"), [
    ({"memory_limit": -1}, "memory_limit=-1"),
    ({"memory_limit": 0}, "memory_limit=0"),
    ({"memory_limit": "lots"}, "memory_limit='lots'"),
    ({"latency_limit": 0}, "latency_limit=0"),
    ({"latency_limit": -2.0}, "latency_limit=-2.0"),
    ({"latency_limit": "fast"}, "latency_limit='fast'"),
])
def test_nonsense_limits_are_named(limits: dict[str, Any], match: str) -> None:
    _fails_cleanly(lambda m, o, b: peakcut.optimize(m, b, loss_fn, o, **FAST, **limits), LimitError, match)


@pytest.mark.parametrize(("arguments", "match"), [
    ({"time_budget": -1}, "time_budget=-1"),
    ({"time_budget": float("nan")}, "time_budget=nan"),
    ({"time_budget": "soon"}, "time_budget='soon'"),
    ({"time_budget": None}, "time_budget=None"),
    ({"seed": "x"}, "seed='x'"),
    ({"max_states": 0}, "max_states=0"),
    ({"jobs": 0}, "jobs=0"),
    ({"device": "tpu9"}, "unknown cost model 'tpu9'"),
    ({"fission_dims": "banana"}, "fission_dims='banana'"),
    ({"memory_limit": 0.5, "latency_limit": 1.1}, "not both"),
])
def test_nonsense_search_arguments_are_named(arguments: dict[str, Any], match: str) -> None:
    _fails_cleanly(lambda m, o, b: peakcut.optimize(m, b, loss_fn, o, **(FAST | arguments)), ValueError, match)


def test_an_infeasible_limit_and_a_zero_budget_say_so_with_the_best_plan() -> None:
    _fails_cleanly(lambda m, o, b: peakcut.optimize(m, b, loss_fn, o, memory_limit=10, **FAST),
                   peakcut.LimitNotMet, "peak limit not met: best .*, limit 10 B")
    errors: list[peakcut.LimitNotMet] = []

    def zero_budget(m: nn.Module, o: torch.optim.Optimizer, b: Any) -> None:
        try:
            peakcut.optimize(m, b, loss_fn, o, memory_limit=0.5, device="h200", time_budget=0)
        except peakcut.LimitNotMet as e:
            errors.append(e)
            raise
    _fails_cleanly(zero_budget, peakcut.LimitNotMet, r"of a 0 s budget")
    model, opt, batch = _trained()
    assert errors[0].plan.step(batch).isfinite()        # the best plan found runs


def test_a_batch_that_fails_in_the_loss_leaves_model_and_optimizer_untouched() -> None:
    """The update's parts that need no gradient (weight decay, beta2 * exp_avg_sq) must not
    run before the loss: a label out of range fails there, after they would have."""
    def call(m: nn.Module, o: torch.optim.Optimizer, b: Any) -> Any:
        plan = peakcut.optimize(m, b, loss_fn, o, **FAST)
        return plan.step((b[0], torch.full_like(b[1], 7)))
    _fails_cleanly(call, (IndexError, RuntimeError), "out of bounds")


@pytest.mark.parametrize(("wrong", "error", "match"), [
    (lambda b: (b[0],), peakcut.CaptureError, r"another shape or dtype \(6x8 float32; planned for 6x8 "
     r"float32, 6 int64\) could not be planned.*not enough values to unpack"),
    (lambda b: (torch.randn(b[0].shape[0], 9), b[1]), peakcut.CaptureError,
     r"6x9 float32, 6 int64; .* in module 'fc1' \(Linear\)"),
    (lambda b: (b[0].double(), b[1]), RuntimeError, "dtype"),     # PyTorch's own error, as in eager
])
def test_a_wrong_batch_at_run_time(wrong: Callable[[Any], Any], error: type[Exception], match: str) -> None:
    def call(m: nn.Module, o: torch.optim.Optimizer, b: Any) -> Any:
        plan = peakcut.optimize(m, b, loss_fn, o, **FAST)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")       # "planned again": the new shape is planned first
            return plan.step(wrong(b))
    _fails_cleanly(call, error, match)


def test_a_wrong_batch_without_replanning_is_refused_before_it_runs() -> None:
    def call(m: nn.Module, o: torch.optim.Optimizer, b: Any) -> Any:
        plan = peakcut.optimize(m, b, loss_fn, o, replan=False, **FAST)
        return plan.step((b[0].double(), b[1]))
    _fails_cleanly(call, StepBindingError, r"6x8 float64.*planned for 6x8 float32|float64")


def test_corrupt_foreign_and_mismatched_saved_plans(tmp_path: Path) -> None:
    model, opt, batch = _trained()
    peakcut.optimize(model, batch, loss_fn, opt, **FAST).save(tmp_path / "plan")
    (tmp_path / "corrupt").mkdir()
    for name in ("graph.json", "order.json", "report.json"):
        (tmp_path / "corrupt" / name).write_text("{not json")
    (tmp_path / "foreign").mkdir()
    for name in ("graph.json", "order.json", "report.json"):
        (tmp_path / "foreign" / name).write_text(json.dumps({"hello": 1}))
    _fails_cleanly(lambda m, o, b: peakcut.load_plan(tmp_path / "corrupt", m, o), GraphError, "invalid JSON")
    _fails_cleanly(lambda m, o, b: peakcut.load_plan(tmp_path / "foreign", m, o), GraphError, "format tag")
    _fails_cleanly(lambda m, o, b: peakcut.load_plan(tmp_path / "nowhere", m, o), FileNotFoundError,
                   "not a saved plan")

    class Wider(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.norm, self.fc2 = nn.Linear(8, 32), nn.LayerNorm(32), nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.relu(self.norm(self.fc1(x))))

    _fails_cleanly(lambda m, o, b: peakcut.load_plan(tmp_path / "plan", m, o).step(b), StepBindingError,
                   r"param:fc1\.weight: got shape \(32, 8\)", model=Wider())


def _eager_steps(model: nn.Module, batch: Any, steps: int) -> list[torch.Tensor]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("layout", ["non-contiguous", "zero-size batch"])
def test_unusual_inputs_work_and_give_eager_numbers(layout: str) -> None:
    model, (x, y) = make_mlp()
    if layout == "non-contiguous":
        x = torch.randn(x.shape[1], x.shape[0]).t()
    else:
        x, y = x[:0], y[:0]
    ref = copy.deepcopy(model)
    expected = _eager_steps(ref, (x, y), 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, (x, y), loss_fn, opt, **FAST)
    got = [plan.step((x, y)) for _ in range(2)]
    torch.testing.assert_close(torch.stack(got), torch.stack(expected), equal_nan=True)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, equal_nan=True)


def _same_steps(model: nn.Module, batch: Any, loss: Callable[[nn.Module, Any], torch.Tensor],
                **limits: Any) -> peakcut.Plan:
    """Plan `model` and check 2 steps against eager (loss and parameters); returns the plan."""
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = peakcut.optimize(model, batch, loss, opt, **FAST, **limits)
    for _ in range(2):
        expected = loss(ref, batch)
        expected.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        torch.testing.assert_close(plan.step(batch), expected.detach())
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q)
    return plan


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).mean((2, 3)))


def test_a_channels_last_input_gives_eager_numbers() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8).to(memory_format=torch.channels_last)
    _same_steps(SmallCNN(), (x, torch.randint(0, 4, (4,))), loss_fn)


class MaskedBag(nn.Module):
    """Token ids (int64) and a padding mask (bool) in the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) * mask.unsqueeze(-1)
        return self.head(h.sum(1) / mask.sum(1, keepdim=True))


def test_integer_and_bool_inputs_give_eager_numbers() -> None:
    torch.manual_seed(0)
    ids, mask = torch.randint(0, 20, (4, 6)), torch.rand(4, 6) > 0.3
    mask[:, 0] = True

    def loss(m: nn.Module, b: Any) -> torch.Tensor:
        return nn.functional.cross_entropy(m(b[0], b[1]), b[2])
    _same_steps(MaskedBag(), (ids, mask, torch.randint(0, 4, (4,))), loss)


class WithUnknownOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.logcumsumexp(self.fc1(x), dim=1))


def test_an_op_peakcut_does_not_know_runs_untransformed() -> None:
    model, (x, y) = make_mlp()
    g = peakcut.capture(WithUnknownOp(), (x, y), loss_fn, "adamw")
    unknown = sorted({g.nodes[n].op for n in g.nodes if g.is_opaque(n)})
    assert unknown and all("logcumsumexp" in op for op in unknown)
    plan = _same_steps(WithUnknownOp(), (x, y), loss_fn, latency_limit=2.0)
    kept = [plan.graph.nodes[n] for n in plan.graph.nodes if plan.graph.is_opaque(n)]
    assert sorted(n.op for n in kept) == sorted(g.nodes[n].op for n in g.nodes if g.is_opaque(n))
    assert all(n.tags.get(FissionTag) is None and n.tags.get(RematTag) is None for n in kept)


def test_a_measured_search_that_fails_leaves_the_model_as_it_was() -> None:
    """device="measured" runs the user's step for real (calibration, verification): after
    LimitNotMet the parameters and the AdamW state are those of before the call."""
    _fails_cleanly(lambda m, o, b: peakcut.optimize(m, b, loss_fn, o, memory_limit=10, device="measured",
                                                    time_budget=2), peakcut.LimitNotMet, "limit not met")
