"""bench.gpu, the GPU acceptance command, run on the CPU as a dry run of itself: the run end to
end (files, figures, peers, plans, number checks, a workload that crashes, one that does not
fit the deadline), a process stopped past its slot, the time plan, the number check and the
best peer. Behaviour only: no figure is judged by its size."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.gpu import numbers, peers
from bench.gpu.child import Workload
from bench.gpu.runner import Settings, _row, _start, child_command, jobs_of, run
from bench.gpu.timeplan import (
    LIMITS,
    MIN_BUDGET_S,
    ORDER,
    Effort,
    Slot,
    child_budget,
    fixed_seconds,
    plan_run,
)
from peakcut.workloads import WORKLOAD_NAMES

CRASH = "import sys; print('setting up', flush=True); sys.exit('a crash before any row')"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the dry run on a CPU (a GPU runs bench.gpu itself)")
def test_the_run_end_to_end(tmp_path: Path) -> None:
    """Two workloads run for real at tiny size (the time plan's estimates scaled up for a CPU
    shared with other work), BERT-base under the latency limit and ResNet-50 under the memory
    limit (refused at once: the limit is below what its step holds between steps); vit-base's
    process crashes. ResNet-50 is the one whose numbers must equal eager's: it has no key bias
    under softmax, whose zero gradient AdamW turns into a whole update of the sign of its
    rounding noise (bench.measured judges those against a float64 run; this check does not)."""
    settings = Settings(jobs_of(["bert-base:latency", "resnet50:memory", "vit-base:latency"], list(LIMITS)),
                        size="tiny", effort=Effort(runs=2, peer_runs=1, fixed_budget=2.0, slowdown=20.0),
                        deadline=3000.0, out=tmp_path)
    normal = child_command(settings)
    results = run(settings, lambda name: [sys.executable, "-c", CRASH] if name == "vit-base" else normal(name))

    on_disk = json.loads((tmp_path / "results.json").read_text())
    assert on_disk["rows"] == json.loads(json.dumps(results["rows"], default=str))
    rows = {r["workload"]: r for r in on_disk["rows"]}
    assert list(rows) == ["bert-base", "resnet50", "vit-base"]
    assert on_disk["device"] == "cpu (dry run)" and [s["workload"] for s in on_disk["time_plan"]] == list(rows)
    table = (tmp_path / "results.md").read_text()
    assert "BERT-base" in table and "ResNet-50" in table and "a crash before any row" in table

    for name, limit in (("bert-base", "latency"), ("resnet50", "memory")):
        row = rows[name]
        assert "error" not in row and list(row["limits"]) == [limit], row.get("error")
        assert row["eager"]["max_memory_allocated"] > row["eager"]["allocated_between_steps"] > 0
        assert row["eager"]["max_memory_reserved"] > 0 and len(row["eager"]["times_s"]) == 2
        assert row["eager"]["numbers"] == {"reference": "eager"}
        assert sorted(row["peers"]) == sorted(peers.names())
        for peer, entry in row["peers"].items():       # a peer that fails (BatchNorm on one sample) is its entry
            assert "error" in entry or (len(entry["times_s"]) == 1 and entry["ratios"]["allocated"] > 0
                                        and "equal" in entry["numbers"]), (peer, entry)
        sac = row["peers"][peers.SAC]
        assert sac["numbers"]["equal"] and sac["numbers"]["expected_equal"], sac["numbers"]
        entry = row["limits"][limit]
        assert entry["budget_s"] == 2.0 and entry["model_unchanged_by_optimize"]
        plan = entry["measured"]
        assert plan["max_memory_allocated"] > 0 and plan["max_memory_reserved"] > 0 and len(plan["times_s"]) == 2
        assert plan["numbers"]["reference"] == "eager" and plan["numbers"]["tolerance"] > 0
        assert {"loss", "exp_avg", "exp_avg_sq", "updates"} <= set(plan["numbers"])
        assert entry["ratios"]["time"] > 0 and entry["best_peer"]["name"] in peers.names()
        assert entry["beats_best_peer"] in (True, False)
        assert entry["phases"]["states"] >= 1 and entry["predicted"]["peak_ratio"] > 0
        assert row["simulated"]["profile"] == "h200" and row["simulated"][limit]["peak_ratio"] > 0
    assert "verification" in rows["bert-base"]["limits"]["latency"]["report"]
    assert rows["resnet50"]["limits"]["memory"]["status"].startswith("LimitNotMet")
    assert rows["resnet50"]["limits"]["memory"]["measured"]["numbers"]["equal"]
    assert "why_not_exact" in rows["bert-base"]["peers"]["accumulation k=2"]["numbers"]

    assert rows["vit-base"]["error"].startswith("exit 1: a crash before any row")
    assert (tmp_path / "logs" / "vit-base.txt").read_text().startswith("setting up")
    log = (tmp_path / "log.txt").read_text()
    assert "==== bert-base" in log and "==== vit-base\nsetting up" in log and "\nROW " not in log


FAKE = ("import json, pathlib, sys; slot = json.loads(sys.stdin.readline()); "
        "done = pathlib.Path(sys.argv[1]) / 'results.json'; "
        "seen = [r['workload'] for r in json.loads(done.read_text())['rows']] if done.exists() else []; "
        "print('ROW ' + json.dumps({'workload': slot['workload'], 'slot': slot, 'seen': seen}), flush=True)")


def test_the_deadline_leaves_out_what_does_not_fit_and_says_so(tmp_path: Path) -> None:
    """Processes that only report the slot they were given: BERT-base gets both limits,
    ResNet-50 its latency limit, BTLM-3B nothing (a row saying why), in ORDER."""
    effort = Effort(runs=3, fixed_budget=10.0)
    deadline = fixed_seconds("bert-base", 2, effort) + fixed_seconds("resnet50", 1, effort) + 3 * 10.0 + 1.0
    assert fixed_seconds("btlm-3b", 1, effort) > deadline / 2
    jobs = jobs_of(["btlm-3b:latency", "resnet50:latency", "bert-base"], list(LIMITS))
    results = run(Settings(jobs, size="tiny", effort=effort, deadline=deadline, out=tmp_path),
                  lambda name: [sys.executable, "-c", FAKE, str(tmp_path)])
    rows = {r["workload"]: r for r in json.loads((tmp_path / "results.json").read_text())["rows"]}
    assert list(rows) == ["bert-base", "resnet50", "btlm-3b"] == [r["workload"] for r in results["rows"]]
    assert rows["bert-base"]["slot"]["limits"] == ["latency", "memory"] and rows["bert-base"]["slot"]["budget_s"] == 10.0
    assert rows["resnet50"]["slot"]["limits"] == ["latency"] and "error" not in rows["resnet50"]
    assert rows["bert-base"]["seen"] == [] and rows["resnet50"]["seen"] == ["bert-base"]   # written after each
    assert rows["btlm-3b"]["error"].startswith("not run: latency limit: not run, would not fit")
    assert "btlm-3b: latency limit: not run, would not fit" in (tmp_path / "results.md").read_text()


def test_a_process_past_its_slot_is_stopped_and_keeps_its_row(tmp_path: Path) -> None:
    script = ("import sys, time; sys.stdin.readline(); print('ROW {\"workload\": \"unet\", \"eager\": {}}'); "
              "print('ROW {\"workload\": \"unet\", \"eag', flush=True); time.sleep(60)")   # the last one cut off
    started = _start("unet", lambda name: [sys.executable, "-c", script], tmp_path)
    row = _row(started, Slot("unet", ["latency"], 10.0, 1.0, 3, 2), timeout=3.0)
    assert row["workload"] == "unet" and row["eager"] == {} and row["error"].startswith("stopped after")
    assert started.proc.returncode is not None


def test_the_time_plan_admits_latency_limits_first_and_says_what_it_leaves_out() -> None:
    jobs = [(w, lim) for w in ORDER for lim in LIMITS]
    assert sorted(ORDER) == sorted(WORKLOAD_NAMES)
    full = plan_run(jobs, 540.0, Effort())
    assert [s.workload for s in full] == list(ORDER)
    assert all("latency" in s.limits for s in full) and sum(s.seconds for s in full) <= 540.0
    assert all(s.budget_s >= MIN_BUDGET_S and s.runs >= 3 for s in full)
    short = plan_run(jobs, 250.0, Effort())
    admitted = [(s.workload, lim) for s in short for lim in s.limits]
    assert admitted and sum(s.seconds for s in short) <= 250.0
    assert all((w, "latency") in admitted for w, lim in admitted if lim == "memory")   # latency limits first
    assert [w for w, lim in admitted if lim == "latency"][:2] == ["bert-base", "resnet50"]
    for s in short:
        left_out = set(LIMITS) - set(s.limits)
        assert len(s.skipped) == len(left_out) and all("would not fit" in why for why in s.skipped)
        assert (s.seconds == 0) == (not s.limits)
    pinned = plan_run(jobs[:2], 540.0, Effort(runs=4, fixed_budget=7.0))
    assert pinned[0].budget_s == 7.0 and pinned[0].fixed and pinned[0].runs == 4 and pinned[0].peer_runs == 2
    assert child_budget(30.0, 100.0, 2, 20.0) == 30.0              # the planned budget fits
    assert child_budget(30.0, 60.0, 2, 20.0) == 20.0               # shrunk to what is left
    assert child_budget(30.0, 30.0, 2, 20.0) == 0.0                # less than MIN_BUDGET_S: skipped


def test_the_number_check_refuses_a_different_update() -> None:
    model = torch.nn.Linear(4, 4, bias=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    init = {"weight": model.weight.detach().clone()}
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    loss = torch.tensor(1.0)
    ref = numbers.reference("eager", model, opt, loss, init)
    same = numbers.check(ref, model, opt, loss, 1e-6)
    assert same["equal"] and same["updates"] == 0.0 and same["reference"] == "eager"
    with torch.no_grad():
        model.weight.add_(1e-4)
    off = numbers.check(ref, model, opt, loss, 1e-6)
    assert not off["equal"] and off["updates"] > off["tolerance"] and off["exp_avg"] == 0.0


def test_the_best_peer_under_each_limit() -> None:
    ran: dict[str, dict[str, Any]] = {"accumulation k=2": {"ratios": {"time": 1.05, "allocated": 0.6}},
           "accumulation k=4": {"ratios": {"time": 1.20, "allocated": 0.4}},
           peers.SAC: {"ratios": {"time": 1.08, "allocated": 0.7}}, "broken": {"error": "x", "ratios": None}}
    latency = peers.best(ran, "latency", 1.10)
    assert latency["name"] == "accumulation k=2" and latency["meets"]
    memory = peers.best(ran, "memory", 0.5)
    assert memory["name"] == "accumulation k=4" and memory["meets"]
    none = peers.best(ran, "memory", 0.3)
    assert none["name"] == "accumulation k=4" and not none["meets"] and "closest" in none["why"]
    assert peers.beats({"time": 1.09, "allocated": 0.5}, latency, "latency", 1.10)
    assert not peers.beats({"time": 1.09, "allocated": 0.7}, latency, "latency", 1.10)
    assert not peers.beats({"time": 1.2, "allocated": 0.1}, latency, "latency", 1.10)
    assert peers.beats(None, latency, "latency", 1.10) is None


def test_where_eager_runs_out_of_memory_the_first_exact_peer_is_the_reference() -> None:
    """As the LLMs at batch 32 do on an 80 GB GPU: eager's failure is its entry, BERT's
    accumulation (not exact: its masked-LM mean) is not checked, selective checkpointing is
    the reference, and nothing is a ratio to eager."""
    w = Workload("bert-base", "tiny", None, Slot("bert-base", ["latency"], 2.0, 600.0, 2, 1).as_dict())

    def out_of_memory() -> None:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    w.row["eager"] = w.run_config("eager", torch.optim.AdamW(w.model.parameters()), out_of_memory, 2)
    assert w.row["eager"]["out_of_memory"] and "Tried to allocate" in w.row["eager"]["error"]
    w.peers()
    found = w.row["peers"]
    assert "no reference step ran" in found["accumulation k=2"]["numbers"]["unchecked"]
    assert found[peers.SAC]["numbers"] == {"reference": peers.SAC} and w.ref is not None
    assert all(p["ratios"] is None for p in found.values())
    assert peers.best(found, "latency", 1.10)["name"] is None
