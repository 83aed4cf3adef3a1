"""bench.measured's number check: where the update is compared (moments_agree), and the float64
referee for tensors over the rounding tolerance."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from bench.measured.configs import LR, Built, eager_step
from bench.measured.numbers import (
    Quantity,
    build_float64_eager,
    compare_steps,
    float64_bytes,
    guarded_float64_eager,
    moments_agree,
    number_tolerance,
)
from peakcut.workloads.base import WorkloadInstance


def test_updates_are_compared_where_the_moments_agree() -> None:
    tol = number_tolerance(2)
    ref = {"exp_avg": torch.tensor([1e-3, 1e-9, 2e-4]), "exp_avg_sq": torch.tensor([1e-6, 1e-18, 4e-8])}
    plan = {"exp_avg": torch.tensor([1e-3, -1e-9, 2e-4 * (1 + tol / 2)]),    # a rounding-zero gradient flips
            "exp_avg_sq": torch.tensor([1e-6, 1e-18, 4e-8])}
    assert moments_agree(ref, plan, tol).tolist() == [True, False, True]
    assert moments_agree({}, {}, tol) is None                    # not AdamW: every element compared
    only_first = moments_agree({"exp_avg": ref["exp_avg"]}, {"exp_avg": plan["exp_avg"]}, tol)
    assert only_first.tolist() == [True, False, True]


class _ShiftedSoftmax(torch.nn.Module):
    """Logits x @ w + b with one scalar b added to every class: softmax ignores it, so b's
    gradient is zero in exact arithmetic and rounding noise in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 32))
        self.b = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w + self.b


def _instance() -> WorkloadInstance:
    torch.manual_seed(0)
    model = _ShiftedSoftmax()
    batch = (torch.randn(256, 64), torch.randint(0, 32, (256,)))

    def loss_fn(m: torch.nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return F.cross_entropy(m(b[0]), b[1])

    return WorkloadInstance("shifted", "tiny", model, batch, loss_fn, torch.float32, 256, "test")


def _built(inst: WorkloadInstance, parts: int, lr_scale: float = 1.0) -> Built:
    """The eager loop, the batch summed in `parts` parts as a batch fission does (another
    summation order); `lr_scale` != 1 makes a plan that is wrong."""
    model = copy.deepcopy(inst.model)
    opt = torch.optim.AdamW(model.parameters(), lr=LR * lr_scale)
    x, y = inst.batch

    def loss() -> torch.Tensor:
        return sum(inst.loss_fn(model, (xp, yp)) * len(xp) for xp, yp in
                   zip(x.chunk(parts), y.chunk(parts), strict=True)) / len(x)

    return Built(f"{parts} parts", eager_step(model, opt, loss), model, opt)


def test_a_rounding_zero_gradient_is_judged_against_float64() -> None:
    inst = _instance()
    got = compare_steps(inst.model, _built(inst, 1), _built(inst, 4), referee=lambda: build_float64_eager(inst))
    assert got["ok"], got["over_tolerance"]
    assert all(j["where"].startswith("b ") for j in got["over_tolerance"])     # only the shift, if anything
    if got["over_tolerance"]:
        assert got["referee"] == "float64 eager"


def test_a_wrong_plan_fails_with_the_referee_too() -> None:
    inst = _instance()
    got = compare_steps(inst.model, _built(inst, 1), _built(inst, 4, lr_scale=1.5),
                        referee=lambda: build_float64_eager(inst))
    assert not got["ok"]
    assert any(j["what"] == "update" and j["where"] == "w" and not j["ok"] for j in got["over_tolerance"])


def test_without_a_referee_every_tensor_over_the_tolerance_is_listed() -> None:
    inst = _instance()
    got = compare_steps(inst.model, _built(inst, 1), _built(inst, 4, lr_scale=1.5))
    assert not got["ok"] and got["referee"] is None
    assert "w" in {j["where"] for j in got["over_tolerance"] if j["what"] == "update"}


def test_the_referee_accepts_noise_of_eager_s_size_and_rejects_more() -> None:
    exact = torch.zeros(8, dtype=torch.float64)
    eager = torch.full((8,), 1e-9)
    tol = number_tolerance(2)
    noise = Quantity("moments", "b", eager, -1.5 * eager, moment="exp_avg").judged(exact, tol)
    assert noise["ok"] and noise["max_rel"] > tol
    wrong = Quantity("moments", "b", eager, eager + 1e-6, moment="exp_avg").judged(exact, tol)
    assert not wrong["ok"]


def test_a_referee_that_would_not_fit_leaves_the_tensors_unjudged() -> None:
    """guarded_float64_eager refuses when the float64 step's estimated peak exceeds what is
    free: the tensors over the tolerance stay listed and the check fails, saying why."""
    inst = _instance()
    peak = 1 << 20
    assert float64_bytes(inst, peak) == 2 * peak               # float32 widened to float64
    got = compare_steps(inst.model, _built(inst, 1), _built(inst, 4, lr_scale=1.5),
                        referee=lambda: guarded_float64_eager(inst, peak, lambda: peak))
    assert not got["ok"] and got["over_tolerance"]
    assert got["referee"].startswith("float64 eager not run: needs about")
    roomy = compare_steps(inst.model, _built(inst, 1), _built(inst, 4, lr_scale=1.5),
                          referee=lambda: guarded_float64_eager(inst, peak, lambda: 4 * peak))
    assert roomy["referee"] == "float64 eager"
