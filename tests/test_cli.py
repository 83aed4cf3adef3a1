"""The peakcut command."""

from __future__ import annotations

import json

from peakcut.cli import main


def test_workloads_lists_all(capsys):
    assert main(["workloads", "--json"]) == 0
    names = [w["name"] for w in json.loads(capsys.readouterr().out)]
    assert names == ["resnet50", "bert-base", "vit-base", "unet", "unetpp", "gpt-neo-1.3b", "btlm-3b"]


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
    assert plot.stat().st_size > 10_000


def test_profile_table(capsys):
    assert main(["profile", "resnet50", "--size", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "eager peak (simulated)" in out and "hot-spots" in out
    assert "re-ordered peak (simulated)" in out
