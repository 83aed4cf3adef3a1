"""The peakcut command."""

from __future__ import annotations

import json

from peakcut.cli import main


def test_workloads_lists_all(capsys):
    assert main(["workloads", "--json"]) == 0
    names = [w["name"] for w in json.loads(capsys.readouterr().out)]
    assert names == ["resnet50", "bert-base", "vit-base", "unet", "unetpp", "gpt-neo-1.3b", "btlm-3b",
                     "llama2-7b", "gpt2-xl"]


def test_profile_json_and_plot(capsys, tmp_path):
    plot = tmp_path / "timeline.png"
    assert main(["profile", "vit-base", "--size", "tiny", "--optimizer", "sgd", "--json", "--plot", str(plot)]) == 0
    facts = json.loads(capsys.readouterr().out)
    for key in ("nodes", "param_bytes", "eager_peak_bytes", "reordered_peak_bytes", "seconds",
                "hotspots_by_module"):
        assert key in facts
    assert facts["eager_peak_bytes"] > facts["param_bytes"] > 0
    assert facts["reorder_lower_bound_bytes"] <= facts["reordered_peak_bytes"] <= facts["eager_peak_bytes"]
    assert facts["ftree_levels"] == len(facts["ftree_nodes_per_level"])
    assert "fission_root_peak_bytes" in facts
    floors = facts["floors"]
    assert floors["device"] == "h100" and 0 < floors["memory_bytes"] <= facts["eager_peak_bytes"]
    assert 0 < floors["compute_seconds"] <= floors["latency_at_memory_floor_seconds"]
    assert plot.stat().st_size > 10_000


def test_profile_table(capsys):
    assert main(["profile", "resnet50", "--size", "tiny", "--device", "rtx3090"]) == 0
    out = capsys.readouterr().out
    assert "eager peak (simulated)" in out and "hot-spots" in out
    assert "memory floor on rtx3090" in out and "compute floor on rtx3090" in out
    assert "re-ordered peak (simulated)" in out


def test_optimize_writes_program_report_and_plots(capsys, tmp_path):
    out = tmp_path / "opt"
    code = main(["optimize", "bert-base", "--size", "tiny", "--latency-limit", "1.5", "--time-budget", "4",
                 "--device", "rtx3090", "--pareto", "--out", str(out)])
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    for key in ("eager_peak_bytes", "peak_bytes", "eager_latency_s", "latency_s", "memory_method",
                "latency_method", "applied", "floors", "overhead_vs_compute_floor"):
        assert key in report
    assert report["peak_bytes"] <= report["eager_peak_bytes"]
    assert (out / "program.py").read_text().startswith('"""')
    assert (out / "memory.png").stat().st_size > 10_000 and (out / "pareto.png").stat().st_size > 5_000
    printed = capsys.readouterr().out
    assert "peak memory" in printed and "over the compute floor" in printed


def test_optimize_exits_3_when_the_limit_is_not_met(tmp_path):
    code = main(["optimize", "resnet50", "--size", "tiny", "--memory-limit", "1KB", "--time-budget", "2",
                 "--out", str(tmp_path / "x")])
    assert code == 3
    assert (tmp_path / "x" / "report.json").exists()


def test_optimize_loads_a_module_factory(tmp_path, monkeypatch):
    (tmp_path / "mymodels.py").write_text(
        "import torch\n"
        "def make():\n"
        "    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
        "    batch = (torch.randn(4, 8), torch.randint(0, 2, (4,)))\n"
        "    return m, batch, lambda model, b: torch.nn.functional.cross_entropy(model(b[0]), b[1])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["optimize", "mymodels:make", "--time-budget", "1", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "program.py").exists()
