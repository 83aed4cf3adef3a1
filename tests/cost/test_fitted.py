"""Fitted prices (peakcut.cost.fitted): a call not measured yet is priced from the measured
calls of its family, nothing run; the work a fit reads is kept in the cost cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from peakcut.cost import MeasuredCostModel, TimingSettings
from peakcut.cost.fitted import MIN_SECONDS, FittedPrices, Work
from tests.cost.graphs import NODE, add_graph, mm_graph

FAST = TimingSettings(warmup=1, repeats=3, min_loop_seconds=2e-5, retries=0, rounds=3)


def _mm(n: int, seconds_per_flop: float = 1e-10, launch: float = 4e-6) -> tuple[Work, float]:
    flops = 2.0 * n ** 3
    return Work("aten.mm.default:float32", flops, 12.0 * n * n, flops / 1e12), launch + seconds_per_flop * flops


def test_a_family_with_enough_points_is_priced_by_its_linear_fit() -> None:
    fit = FittedPrices()
    for n in (32, 64, 128, 256):
        fit.add(*_mm(n))
    work, truth = _mm(1024)            # far outside the points: the line carries it
    seconds, how = fit.price(work)
    assert how == "fitted"
    assert seconds == pytest.approx(truth, rel=1e-6)


def test_few_points_scale_the_analytic_estimate_and_other_families_borrow_the_scale() -> None:
    fit = FittedPrices()
    work, seconds = _mm(64)
    fit.add(work, seconds)
    other, _ = _mm(128)
    scale = seconds / work.analytic
    assert fit.price(other) == (pytest.approx(other.analytic * scale), "scaled")
    stranger = Work("aten.add.Tensor:float32", 0.0, 4e6, 2e-5)
    assert fit.price(stranger) == (pytest.approx(2e-5 * scale), "scaled")


def test_no_points_give_the_analytic_estimate_and_no_price_is_zero() -> None:
    fit = FittedPrices()
    assert fit.price(Work("aten.add.Tensor:float32", 0.0, 8.0, 3e-6)) == (3e-6, "analytic")
    assert fit.price(Work("aten.view.default:float32", 0.0, 0.0, 0.0))[0] == MIN_SECONDS


def test_coefficients_are_never_negative() -> None:
    """Points a free fit would give a negative intercept: the fit keeps a, b, c >= 0, so a
    smaller call than any measured is never priced below zero."""
    fit = FittedPrices()
    for n, s in ((1000, 1e-6), (2000, 3e-6), (4000, 7e-6), (8000, 1.5e-5)):
        fit.add(Work("aten.relu.default:float32", float(n), 8.0 * n, 1e-6), s)
    seconds, how = fit.price(Work("aten.relu.default:float32", 1.0, 8.0, 1e-6))
    assert how in ("fitted", "scaled") and seconds > 0


def test_the_measured_model_prices_an_unmeasured_call_from_its_family(tmp_path: Path) -> None:
    """Calls of one op measured at three sizes price a fourth size at once: nothing is run and
    nothing is added to the table; a model loading the cache file fits from the same points."""
    model = MeasuredCostModel("cpu", cache_dir=tmp_path, settings=FAST, line_overhead=False)
    for n in (1 << 12, 1 << 14, 1 << 16):
        model.node_seconds(add_graph(n), NODE)
    measured = model.measurements
    g = add_graph(1 << 15)
    job = model.job(g, NODE)
    seconds, how = model.fitted_seconds(job)
    assert how in ("fitted", "scaled") and seconds > 0
    assert model.measurements == measured and not model.has(job.key)
    entries = json.loads(model.cache_path.read_text())["entries"]
    assert all(e["work"][0] == "aten.add.Tensor:float32" for e in entries.values())
    again = MeasuredCostModel("cpu", cache_dir=tmp_path, settings=FAST, line_overhead=False)
    assert again.fit_points == 3
    assert again.fitted_seconds(again.job(g, NODE)) == (pytest.approx(seconds), how)


def test_measure_fills_the_table_and_the_fit(tmp_path: Path) -> None:
    model = MeasuredCostModel("cpu", cache_dir=tmp_path, settings=FAST, line_overhead=False)
    jobs = [model.job(mm_graph(n, n, n), NODE) for n in (16, 32, 48)]
    assert model.measure(jobs) == 3
    assert all(model.has(j.key) for j in jobs) and model.fit_points == 3
    assert model.measure(jobs) == 0                    # known keys are not measured again


def test_a_call_far_beyond_its_family_points_takes_the_ratio_measured_nearest_its_size() -> None:
    """Launch-bound addmm calls of 1 KFLOP fit a line that prices a 24 GFLOP addmm at minutes;
    beyond the points' reach the call takes measured / analytic of the largest calls measured
    (a 24 GFLOP mm here), and a lone outlier point does not price calls 80 times its size."""
    fit = FittedPrices()
    fit.add(Work("aten.addmm.default:float32", 1024.0, 960.0, 4.04e-6), 5.66e-5)
    fit.add(Work("aten.addmm.default:float32", 256.0, 424.0, 4.02e-6), 1.06e-5)
    fit.add(Work("aten.mm.default:float32", 2.4e10, 1.58e8, 0.12), 0.122)
    fit.add(Work("aten._softmax_backward_data.default:float32", 4096.0, 24576.0, 5.0e-6), 7.9e-3)
    big = Work("aten.addmm.default:float32", 2.4e10, 1.58e8, 0.12)
    assert fit.price(big) == (pytest.approx(0.122), "scaled")
    softmax = Work("aten._softmax_backward_data.default:float32", 1.57e6, 9.4e6, 4.0e-4)
    assert fit.price(softmax) == (pytest.approx(4.0e-4 * 0.122 / 0.12), "scaled")
    small = Work("aten.addmm.default:float32", 512.0, 600.0, 4.03e-6)       # within reach: the family's fit
    assert fit.price(small)[0] < 1e-4


def test_host_copies_and_calls_without_an_analytic_estimate_keep_their_line_at_any_size() -> None:
    """A copy's line (latency + bytes / bandwidth) holds far beyond its points; a call the
    analytic profile prices at 0 has nothing to scale; a big matmul elsewhere sets no price for either."""
    fit = FittedPrices()
    for n in (1 << 16, 1 << 18, 1 << 20):
        fit.add(Work("copy:to_host", 0.0, float(n), n / 2e10), 5e-6 + n / 1e10)
    fit.add(Work("aten.mm.default:float32", 2.4e10, 1.58e8, 0.12), 0.122)
    huge = Work("copy:to_host", 0.0, float(1 << 30), (1 << 30) / 2e10)
    assert fit.price(huge) == (pytest.approx(5e-6 + (1 << 30) / 1e10), "fitted")
    for n in (1 << 10, 1 << 12):
        fit.add(Work("aten.empty.memory_format:float32", 0.0, float(n), 0.0), 3e-6)
    seconds, _ = fit.price(Work("aten.empty.memory_format:float32", 0.0, float(1 << 24), 0.0))
    assert seconds == pytest.approx(3e-6, rel=0.01)
