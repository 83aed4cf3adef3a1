"""In-context calibration (peakcut.optimizer.context) and the host allocator setting."""

from __future__ import annotations

import platform
import time

import pytest
import torch
from torch import nn

import peakcut
from peakcut.cost.measured import MeasuredCostModel
from peakcut.cost.model import step_seconds
from peakcut.optimizer.budget import BudgetedCost
from peakcut.optimizer.context import HIGHEST, LOWEST, RUNS, ContextCalibration, calibrate, refit
from peakcut.optimizer.verify import EagerStep, Measured, Verdict
from peakcut.runtime import keep_freed_host_memory, release_freed_host_memory


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _problem() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor], torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.LayerNorm(128), nn.Linear(128, 10))
    batch = (torch.randn(32, 64), torch.randint(0, 10, (32,)))
    return model, batch, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_calibrate_sets_the_factor_and_trains_nothing(tmp_path) -> None:
    model, batch, opt = _problem()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = peakcut.capture(model, batch, _loss, opt)
    cost = MeasuredCostModel("cpu", cache_dir=tmp_path)
    standalone = sum(cost.node_seconds(g, n) for n in g.order)
    found = calibrate(g, cost, model, batch, EagerStep(model, batch, _loss, opt, None), opt)
    assert LOWEST <= found.factor <= HIGHEST
    assert cost.context == found.factor
    assert len(found.times) == len(found.eager_times) == RUNS
    assert found.eager_ratio > 0
    scaled = sum(cost.node_seconds(g, n) for n in g.order)
    assert abs(scaled - found.factor * standalone) <= 1e-9 + 1e-6 * scaled
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not opt.state                   # the calibration's eager steps left no AdamW state


def test_optimize_reports_the_calibration(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PEAKCUT_CACHE", str(tmp_path))
    model, batch, opt = _problem()
    plan = peakcut.optimize(model, batch, _loss, opt, device="measured:cpu", time_budget=20)
    ctx = plan.report["context"]
    assert LOWEST <= ctx["factor"] <= HIGHEST and ctx["rounds"] == RUNS
    assert abs(plan.report["eager_ratio"] - ctx["eager_ratio"]) < 1e-3
    assert "glibc" in ctx["host_allocator"]
    assert "keeping freed memory" in plan.report["layout"]["reserved_method"]    # the allocator it runs under
    assert "for running inside the whole step" in plan.report["latency_method"] or ctx["factor"] == 1.0


def test_keep_freed_host_memory_where_glibc() -> None:
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert keep_freed_host_memory() is glibc


def _resident_bytes() -> int:
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f)
    return int(status["VmRSS"].split()[0]) * 1024


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_freed_host_memory_kept_then_released() -> None:
    """With the setting, a freed 64 MiB tensor stays resident; released, it leaves the process."""
    assert keep_freed_host_memory()
    x = torch.ones(16 * 2**20)          # 64 MiB from the heap (no mmap above the threshold now)
    del x
    held = _resident_bytes()
    assert release_freed_host_memory()
    assert held - _resident_bytes() >= 32 * 2**20


class CountedEager(EagerStep):
    """The user's eager step, its runs counted."""

    runs = 0

    def run(self, keep_grads: bool = False) -> torch.Tensor:
        self.runs += 1
        return super().run(keep_grads)


def test_a_skipped_calibration_sizes_verification_on_the_step_the_fitted_prices_give(tmp_path) -> None:
    """With no time to measure the step's calls, nothing runs after the first eager step:
    verification is sized on the step the model prices (fitted and analytic prices for the
    calls not measured), or that first step where it is less, and the model is as it was."""
    model, batch, opt = _problem()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    g = peakcut.capture(model, batch, _loss, opt)
    cost = MeasuredCostModel("cpu", cache_dir=tmp_path)
    eager = CountedEager(model, batch, _loss, opt, None)
    found = calibrate(g, cost, model, batch, eager, opt, seconds=0.0)
    assert "not measured" in found.skipped and found.deferred and not found.eager_times
    assert found.unmeasured > 0 and found.as_dict()["unmeasured_calls"] == found.unmeasured
    assert eager.runs == 1 and found.eager_step_s > 0 and found.factor == 1.0 and cost.context == 1.0
    assert found.eager_step_s <= step_seconds(BudgetedCost(cost, 0.0), g, g.order) + 1e-12
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert not opt.state


class SlowEager(EagerStep):
    """The user's eager step, 50 ms slower than its calls (a step slowed by what ran before it)."""

    def run(self, keep_grads: bool = False) -> torch.Tensor:
        time.sleep(0.05)
        return super().run(keep_grads)


def test_rounds_that_do_not_fit_size_verification_on_the_lesser_of_the_first_step_and_the_model(tmp_path) -> None:
    """Every call measured but no time for the rounds: the step verification is sized on is
    the step the model predicts from the measured calls or, where less, the first eager step."""
    model, batch, opt = _problem()
    g = peakcut.capture(model, batch, _loss, opt)
    cost = MeasuredCostModel("cpu", cache_dir=tmp_path)
    cost.profile(g)
    predicted = sum(cost.node_seconds(g, n) for n in g.order)
    assert predicted < 0.05
    found = calibrate(g, cost, model, batch, SlowEager(model, batch, _loss, opt, None), opt, seconds=0.0)
    assert found.deferred and "takes about" in found.skipped
    assert found.eager_step_s == pytest.approx(predicted)


def test_verification_keeps_its_time_when_the_calibration_is_skipped(tmp_path, monkeypatch) -> None:
    """No share of the budget kept for verification and none for the calibration: the
    calibration's rounds are deferred (verification's give the floor; no warning: the
    report says it), the step's calls are priced by fitted prices, and the plan is still run
    against eager (the time one verification takes is kept from the eager step the skipped
    calibration timed)."""
    import warnings

    import peakcut.optimizer.shares as shares
    monkeypatch.setenv("PEAKCUT_CACHE", str(tmp_path))
    monkeypatch.setattr(shares, "CALIBRATE_SHARE", 0.0)
    monkeypatch.setattr(shares, "MEASURE_BEFORE_SHARE", 0.0)
    monkeypatch.setattr(shares, "VERIFY_SHARE", 0.0)
    model, batch, opt = _problem()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*not calibrated to a whole step")
        try:
            plan = peakcut.optimize(model, batch, _loss, opt, device="measured:cpu", time_budget=20)
        except peakcut.LimitNotMet as e:      # (a busy machine's noise; the reports are there)
            plan = e.plan
    assert plan.report["context"]["skipped"] and plan.report["context"]["deferred"]
    assert "skipped" not in plan.report["verification"], plan.report["verification"]
    assert plan.report["phases"]["seconds"]["verification"] > 0


def _verdict(eager: tuple[float, ...], *candidates: Measured) -> Verdict:
    return Verdict(0, Measured("eager", 100, eager, "cpu-profiler"), candidates, limit=1.1, noise=0.0, seconds=1.0)


def test_refit_takes_the_floor_from_the_fastest_runs_of_every_round() -> None:
    """The floor (untransformed program / eager) is the fastest untransformed run over the
    fastest eager run, over every round that ran both; the kept plan's ratio is the model's
    ratio times it, and its seconds that ratio times eager's median in the verification."""
    # eager slow in the calibration (as after the calls' own timing) and in one verification
    # round, the program in another: the per-round ratios' median would say 0.93
    calibration = ContextCalibration(1.0, 2.0, times=(2.0, 2.0, 2.0), eager_times=(2.4, 2.3, 2.2))
    eager = (2.0, 2.0, 2.1, 2.0, 2.6)
    untransformed = Measured("untransformed step", 90, (2.04, 2.0, 2.0, 2.3, 2.02), "cpu-profiler")
    plan = Measured("plan", 50, (2.4, 2.4, 2.4, 2.4, 2.4), "cpu-profiler")
    fit = refit(1.2, calibration, _verdict(eager, plan, untransformed), "untransformed step")
    assert fit is not None
    assert fit["floor_rounds"] == 8 and fit["floor_rounds_verification"] == 5
    assert fit["floor"] == pytest.approx(1.0)
    assert fit["latency_ratio"] == pytest.approx(1.2)
    assert fit["latency_s"] == pytest.approx(1.2 * 2.0)        # eager's median in the verification


def test_refit_without_the_untransformed_step_uses_the_calibration_alone() -> None:
    """A memory limit's candidates may leave the untransformed step out: the floor comes from
    the calibration's rounds, the level from eager's verification rounds."""
    calibration = ContextCalibration(1.1, 2.0, times=(2.2, 2.1, 2.3), eager_times=(2.0, 2.0, 2.0))
    fit = refit(1.5, calibration, _verdict((1.8, 1.8, 1.9)), "untransformed step")
    assert fit is not None and fit["floor_rounds"] == 3 and fit["floor_rounds_verification"] == 0
    assert fit["floor"] == pytest.approx(1.05)
    assert fit["latency_ratio"] == pytest.approx(1.575)
    assert fit["latency_s"] == pytest.approx(1.575 * 1.8)
    assert refit(1.5, None, _verdict((1.8,)), "untransformed step") is None     # no round ran both
    assert refit(1.5, ContextCalibration(skipped="no time"), _verdict((1.8,)), "untransformed step") is None
