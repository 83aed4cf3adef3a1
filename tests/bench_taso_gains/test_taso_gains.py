"""bench.taso_gains: the hand and fused-attention rule sets searched on a tiny BTLM, written out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.taso_gains import GENERATED, main, rewrites_by_rule, without
from peakcut.rules import RULES


def test_tiny_run_writes_its_cells(tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "gains.json", tmp_path / "gains.md"
    main(["--workloads", "btlm-3b", "--size", "tiny", "--max-states", "2", "--rules", "hand", "attention",
          "--objectives", "memory", "--json", str(out_json), "--md", str(out_md)])
    record = json.loads(out_json.read_text())
    (row,) = record["rows"]
    assert set(row["cells"]) == {"hand/memory", "attention/memory"}
    assert GENERATED not in record["rule_sets"]["hand"] and GENERATED in record["rule_sets"]["attention"]
    hand, fused = row["cells"]["hand/memory"], row["cells"]["attention/memory"]
    for c in (hand, fused):
        assert c["states"] <= 2 and c["peak_ratio"] > 0 and c["latency_ratio"] > 0
    assert "fused" not in hand["rewrites"] and fused["rewrites"].get("fused") == 1   # every attention, at the root
    assert row["direct"]["peak_bytes"][0] == row["direct"]["peak_bytes"][1]   # transposes are views
    text = out_md.read_text()
    assert "simulated, analytic h100 profile" in text.lower() and "| BTLM" in text
    again = tmp_path / "again.md"                    # the page rendered again from the record, no capture
    main(["--render", str(out_json), "--json", "-", "--md", str(again)])
    assert again.read_text() == text


def test_without_drops_one_kind_and_refuses_unknown() -> None:
    hand = without(RULES, GENERATED)
    assert GENERATED not in hand.rewrite_kinds
    assert set(RULES.rewrite_kinds) - set(hand.rewrite_kinds) == {GENERATED}
    with pytest.raises(ValueError, match="kind="):
        without(RULES, "no_such_rule")


def test_rewrites_counted_by_rule_and_substitution() -> None:
    kinds, generated = rewrites_by_rule(["generated: r0017: t(t(a)) => a", "generated: r0017: t(t(a)) => a",
                                         "fused: 24 attention(s) as one fused kernel each"])
    assert kinds == {"fused": 1, "generated": 2} and generated == {"r0017: t(t(a)) => a": 2}
