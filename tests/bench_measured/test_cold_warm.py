"""bench.measured --cold-warm's table and checks, from runs made up here (no model runs)."""

from __future__ import annotations

from typing import Any

from bench.measured import cold_warm


def _run(search_s: float, peak: int, states: int = 400) -> dict[str, Any]:
    seconds = {"capture": 1.0, "calibration": 9.0, "search": search_s, "reprice": 1.0, "verification": 25.0}
    return {"wall_s": sum(seconds.values()), "eager_peak_bytes": 2 << 30, "peak_bytes": peak, "applied": 5,
            "verification": "5 transformations", "note": "",
            "phases": {"seconds": seconds, "measuring_in_search_s": 3.0, "total_s": sum(seconds.values()),
                       "states": {"search": states, "verification": 3}, "search_share": search_s / 90}}


def test_the_table_has_both_runs_and_counts_what_the_bullet_asks() -> None:
    gib = 1 << 30
    pairs = [{"workload": "bert-base", "cold": _run(50.0, int(1.5 * gib)), "warm": _run(52.0, int(1.48 * gib))},
             {"workload": "btlm-3b", "cold": _run(30.0, int(4.0 * gib)), "warm": _run(50.0, int(3.0 * gib))}]
    text = cold_warm.markdown(pairs, "test cpu")
    rows = [line for line in text.splitlines() if line.startswith("| bert-base") or line.startswith("| btlm-3b")]
    assert len(rows) == 4
    assert "| 50.0 | 3.0 | 1.0 | 25.0 |" in rows[0] and "400 / 3" in rows[0]
    assert "x1.014" in rows[0] and "x1.333" in rows[2]
    assert "searching at least half the budget: 1 of 2 (bert-base)" in text
    assert "within 5% of the warm plan's: 1 of 2 (bert-base)" in text
