"""The peakcut command."""

from __future__ import annotations

import json

from peakcut.cli import main


def test_workloads_lists_all(capsys):
    assert main(["workloads", "--json"]) == 0
    names = [w["name"] for w in json.loads(capsys.readouterr().out)]
    assert names == ["resnet50", "bert-base", "vit-base", "unet", "unetpp", "gpt-neo-1.3b", "btlm-3b",
                     "llama2-7b", "gpt2-xl", "reddit-gcn", "reddit-sage", "reddit-gin", "reddit-gat",
                     "reddit-gcn-sparse", "amazon-gcn"]


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


_FACTORY = (
    "import torch\n"
    "def _loss(model, b):\n"
    "    return torch.nn.functional.cross_entropy(model(b[0]), b[1])\n"
    "def _parts():\n"
    "    torch.manual_seed(0)\n"
    "    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))\n"
    "    return m, (torch.randn(4, 8), torch.randint(0, 2, (4,)))\n"
    "def with_optimizer():\n"
    "    m, batch = _parts()\n"
    "    return m, batch, _loss, torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)\n"
    "def as_dict():\n"
    "    m, batch = _parts()\n"
    "    return {'model': m, 'batch': batch, 'loss_fn': _loss}\n"
    "def wrong():\n"
    "    return _parts()\n")


def _in_a_fresh_folder(tmp_path, monkeypatch, name):
    """`name`.py in tmp_path, the current directory; sys.path as the command gets it (no PYTHONPATH)."""
    import sys

    (tmp_path / f"{name}.py").write_text(_FACTORY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_optimize_finds_the_module_in_the_current_directory(tmp_path, monkeypatch, capfd):
    _in_a_fresh_folder(tmp_path, monkeypatch, "cli_factory_opt")
    code = main(["optimize", "cli_factory_opt:with_optimizer", "--max-grad-norm", "1.0", "--time-budget", "1",
                 "--device", "cpu", "--out", "o"])
    assert code == 0
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["optimizer"] == "SGD" and report["max_grad_norm"] == 1.0
    printed = capfd.readouterr()
    assert "USDT" not in printed.out + printed.err      # the terminal shows peakcut's own lines only


def test_profile_takes_a_module_factory_returning_a_dict(tmp_path, monkeypatch, capsys):
    _in_a_fresh_folder(tmp_path, monkeypatch, "cli_factory_dict")
    assert main(["profile", "cli_factory_dict.py:as_dict", "--optimizer", "adam", "--reorder-seconds", "1",
                 "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["optimizer"] == "adam" and facts["size"] is None and facts["nodes"] > 0


def test_factory_errors_name_the_argument(tmp_path, monkeypatch, capsys):
    import pytest

    _in_a_fresh_folder(tmp_path, monkeypatch, "cli_factory_bad")
    cases = [(["optimize", "cli_factory_bad:with_optimizer", "--optimizer", "adamw"], "--optimizer adamw"),
             (["profile", "cli_factory_bad:wrong"], "expected (model, batch, loss_fn)"),
             (["profile", "cli_factory_bad:as_dict", "--size", "tiny"], "--size"),
             (["optimize", "cli_factory_bad:nothing"], "has no function 'nothing'"),
             (["optimize", "no_such_module_here:make"], "cannot import no_such_module_here")]
    for argv, words in cases:
        with pytest.raises(SystemExit, match=words.replace("(", r"\(").replace(")", r"\)")):
            main(argv)
    with pytest.raises(SystemExit):
        main(["optimize", "cli_factory_bad:as_dict", "--max-grad-norm", "0"])
    assert "--max-grad-norm: '0': expected a number > 0" in capsys.readouterr().err


def test_help_says_what_a_factory_may_return(capsys):
    import pytest

    for argv in (["--help"], ["optimize", "--help"], ["profile", "--help"]):
        with pytest.raises(SystemExit):
            main(argv)
        text = capsys.readouterr().out
        assert "MODULE:FACTORY" in text and "(model, batch, loss_fn, optimizer)" in text
        assert "current directory" in text and "--max-grad-norm" in text
