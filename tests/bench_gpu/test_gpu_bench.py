"""bench.gpu, run on the CPU as a dry run of itself: one workload end to end (eager, plan,
number check, peaks, times), and the number check refusing a plan whose update differs."""

from __future__ import annotations

import pytest
import torch

from bench.gpu import _number_check, run_one


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run on a CPU (a GPU runs bench.gpu itself)")
def test_one_tiny_workload_end_to_end() -> None:
    """ResNet-50, not a transformer: AdamW's first update is lr x g / |g|, so a gradient that is
    zero in exact arithmetic (a key bias under softmax) takes the sign of its rounding noise,
    and a plan that rounds differently from eager on another CPU would differ there by whole
    updates (bench.measured judges those against a float64 run; this check does not)."""
    row = run_one("resnet50", "tiny", None, "latency", budget=3.0, runs=2)
    assert row["device"] == "cpu (dry run)" and row["model_unchanged_by_optimize"]
    assert row["numbers"]["equal"], row["numbers"]
    for config in ("eager", "peakcut"):
        figures = row[config]
        assert len(figures["times_s"]) == 2 and figures["max_memory_allocated"] > figures["allocated_between_steps"] > 0
    assert row["ratios"]["time"] > 0 and "verification" in row["report"]
    simulated = row["eager"]["simulated"]      # on a CPU the plan's model is the CPU's own
    assert simulated["peak_bytes"] == simulated["cpu_model_peak_bytes"] > 0
    assert "cpu workspace calibrated" in simulated["method"]


def test_the_number_check_refuses_a_different_update() -> None:
    init = {"w": torch.zeros(4, 4)}
    eager = {"loss": torch.tensor(1.0, dtype=torch.float64), "params": {"w": torch.full((4, 4), 1e-4)},
             "exp_avg": {"w": torch.full((4, 4), 0.1)}}
    same = _number_check(eager, eager, init, torch.float32, 1024)
    assert same["equal"] and same["updates"] == 0.0
    off = dict(eager, params={"w": torch.full((4, 4), 1.1e-4)})
    check = _number_check(eager, off, init, torch.float32, 1024)
    assert not check["equal"] and check["updates"] > check["tolerance"]
