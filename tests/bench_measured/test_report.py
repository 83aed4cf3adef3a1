"""bench.measured's table and checks, from cells made up here (no model runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.measured import __main__ as cli
from bench.measured import report


def _cell(workload: str, name: str, ratio: float, peak: int, **extra: Any) -> dict[str, Any]:
    eager_times = [1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0]
    cell = {"workload": workload, "name": name, "peak_bytes": peak, "host_bytes": 0, "held_bytes": 0,
            "times": [t * ratio for t in eager_times], "eager_times": eager_times, "setup_seconds": 0.0,
            "note": "", "error": "", "numbers": {}, "predicted": {}}
    cell.update(extra)
    return cell


def _peakcut(workload: str, name: str, ratio: float, peak: int, predicted_s: float) -> dict[str, Any]:
    numbers = {k: {"max_rel": 1e-7} for k in ("loss", "update", "moments")}
    numbers.update(ok=True, tolerance=1e-4)
    predicted = {"latency_s": predicted_s, "floor": 0.97, "context_factor": 1.02, "applied": 3, "swaps": 0,
                 "search_seconds": 50.0, "verify_seconds": 20.0}
    return _cell(workload, name, ratio, peak, numbers=numbers, predicted=predicted, setup_seconds=95.0,
                 budget_seconds=90.0 if "memory" in name else 100.0)


def _run(workload: str, held: int) -> dict[str, Any]:
    gib = 1 << 30
    return {"env": "test cpu", "seconds": 60.0, "workloads": [workload], "cells": [
        _cell(workload, "eager", 1.0, 2 * gib, held_bytes=held),
        _cell(workload, "compile aot_eager budget 0.6", 1.09, int(1.5 * gib)),
        _cell(workload, "compile aot_eager budget 0.2", 1.25, int(1.45 * gib)),
        _peakcut(workload, "peakcut latency <= 1.10x", 1.08, int(1.4 * gib), predicted_s=1.05),
        _peakcut(workload, "peakcut memory <= 50%", 1.3, int(1.2 * gib), predicted_s=1.6),
    ]}


def test_the_table_checks_limits_predictions_and_the_held_floor() -> None:
    text = report.markdown([_run("bert-base", held=int(1.3 * (1 << 30)))])
    assert "| bert-base | 1.00 s" in text and "(held 1.30)" in text
    assert "peakcut cells meeting their limit when measured: 1 of 2 planned; 0 refused" in text   # 1.2 > 1.0 GiB
    assert "plans giving eager's numbers (2 steps): 2 of 2." in text
    assert "within their time budget: 1 of 2 (the most over: +6%)." in text and "| 50.0 / 20.0 / 95 (100) |" in text
    assert "predicted step time within 10% of measured: 1 of 2;" in text             # 1.6 vs 1.3 s is not
    assert "on the transformers: 0 of 1 (none)" in text and "bert-base x0.65" in text
    assert "below the best torch.compile budget's peak (by at least 1% of eager's) at equal or lower time: 1 of 1 (bert-base)" in text   # 1.4 < 1.45 GiB, faster


def test_a_limit_refused_before_searching_is_a_cell_that_says_so() -> None:
    run = _run("gpt-neo-1.3b", held=int(1.3 * (1 << 30)))
    run["cells"][-1] = _cell("gpt-neo-1.3b", "peakcut memory <= 50%", 1.0, 0,
                             error="Refused: refused in 9 s: limit 1.00 < held 1.30 GiB")
    text = report.markdown([run])
    assert "| refused in 9 s: limit 1.00 < held 1.30 GiB |" in text
    assert "1 of 1 planned; 1 refused before any search" in text and "gpt-neo-1.3b (memory <= 50%)" in text


def test_a_skipped_calibration_says_why_in_the_table() -> None:
    run = _run("unet", held=1)
    run["cells"][-2]["predicted"] = dict(run["cells"][-2]["predicted"], context_factor=1.0,
                                         context_skipped="the step's calls were not all measured")
    text = report.markdown([run])
    assert "| skipped: the step's calls were not all measured |" in text and "| 1.02 |" in text


def test_a_plan_slower_than_the_best_compile_budget_does_not_beat_it() -> None:
    row = {c["name"]: c for c in _run("vit-base", held=1)["cells"]}
    plan = dict(row["peakcut latency <= 1.10x"], times=[1.3] * 7)
    assert not report.beats_compile(plan, row)
    assert report.beats_compile(row["peakcut latency <= 1.10x"], row)
    best = min(c["peak_bytes"] for n, c in row.items() if n.startswith("compile"))
    a_few_bytes_under = dict(row["peakcut latency <= 1.10x"], peak_bytes=best - 12)
    assert not report.beats_compile(a_few_bytes_under, row)       # no saving: not counted


def test_each_workload_is_saved_as_it_finishes_replacing_its_earlier_cells(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "RESULTS", tmp_path / "results.json")
    cli.save(_run("resnet50", held=1))
    cli.save(_run("bert-base", held=1))
    runs = cli.save(_run("resnet50", held=2))
    saved = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert saved == runs and [r["workloads"] for r in runs] == [["bert-base"], ["resnet50"]]
    assert runs[1]["cells"][0]["held_bytes"] == 2


def test_report_only_rebuilds_the_table_and_one_plot_per_workload_from_results(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "RESULTS", tmp_path / "results.json")
    monkeypatch.setattr(cli, "PLOTS", tmp_path / "plots")
    bench_md = tmp_path / "BENCHMARKS.md"
    bench_md.write_text("# Benchmarks\n")
    monkeypatch.setattr(report.write_benchmarks, "__defaults__", (bench_md,))
    cli.save(_run("resnet50", held=1))
    cli.save(_run("bert-base", held=1))
    cli.main(["--report-only"])
    assert report.START in bench_md.read_text() and "resnet50" in bench_md.read_text()
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == ["medium-bert-base.png", "medium-resnet50.png"]
