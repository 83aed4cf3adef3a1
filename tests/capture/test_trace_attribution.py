"""TraceLog.attribution (a binary search) answers as the scan it replaced."""

from __future__ import annotations

import random

from peakcut.capture.trace import TraceLog
from peakcut.ir.node import Phase


def _scan(log: TraceLog, index: int) -> tuple[str, Phase]:
    module, phase = "", Phase.FORWARD
    for count, m, p in log.marks:
        if count > index:
            break
        module, phase = m, p
    return module, phase


def test_attribution_matches_the_scan() -> None:
    rng = random.Random(0)
    phases = list(Phase)
    for trial in range(200):
        log = TraceLog()
        count = 0
        for k in range(rng.randrange(0, 30)):
            # mostly growing counts, as make_fx's graph grows; some steps back, in case it shrinks
            count = max(0, count + rng.randrange(-2, 5) if trial % 3 == 0 else count + rng.randrange(0, 4))
            log.marks.append((count, f"m{k}", rng.choice(phases)))
        for index in range(-1, count + 3):
            assert log.attribution(index) == _scan(log, index), (trial, index, log.marks)
        log.marks.append((count + 1, "late", Phase.OPTIMIZER))     # marks added after a query count too
        for index in range(-1, count + 3):
            assert log.attribution(index) == _scan(log, index), (trial, index, log.marks)
        if trial % 3:
            assert log.attribution(count + 1) == ("late", Phase.OPTIMIZER)
