"""bench.floor: the untransformed program against eager, one row per workload (run here on a
tiny workload, one round)."""

from __future__ import annotations

import re

from bench.floor import floor_row


def test_a_floor_row_has_both_times_and_the_ratios() -> None:
    row = floor_row("vit-base", rounds=2, size="tiny")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 6, row
    assert float(cells[1]) > 0 and float(cells[2]) > 0
    assert re.fullmatch(r"x\d+\.\d{3} \(\d+\.\d\d-\d+\.\d\d\)", cells[3]), cells[3]
    assert all(re.fullmatch(r"x\d+\.\d{3}", c) for c in cells[4:]), cells[4:]
