"""In-context calibration: the captured step run untransformed, against its predicted time.

    calibration = calibrate(g, cost, model, batch, optimizer)   # sets cost.context

A measured cost model times every call on its own (peakcut.cost.measured). Inside a whole
training step the same calls run slower: a medium-size step touches far more memory than
the caches hold, so each op starts with cold caches, and the allocator hands out memory the
kernel must fault in page by page, where the standalone timing reused warm buffers. On the
2-core development VM the untransformed BERT-base step at batch 4 x 128 ran 18% slower than
the sum of its calls timed alone (docs/cost.md). Those effects scale with the work of the
step, and a plan is mostly the same calls re-arranged, so one factor per step carries them:
context = measured time of the untransformed generated program / its predicted time.

The program runs RUNS times after a warm-up, interleaved with the user's eager step, on the
user's model and optimizer, which are restored afterwards (peakcut.optimizer.verify.Restore);
the median is used. The factor is kept within [LOWEST, HIGHEST]: outside it the runs
measured something else (a busy machine), not the step.

The same rounds give the reference of a latency limit: the user asked for a ratio to their
eager loop, not to the generated program, which may run faster (no module hooks, no
autograd bookkeeping) or slower. eager_ratio = median over the rounds of eager's time / the
untransformed program's time in the same round; the limit is that ratio times the predicted
time of the untransformed step (both now in the calibrated model's seconds).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.codegen.program import Step
from peakcut.cost.measured import MeasuredCostModel
from peakcut.cost.model import step_seconds
from peakcut.ir.graph import Graph
from peakcut.optimizer.verify import Restore

RUNS = 3
LOWEST, HIGHEST = 0.8, 1.6


@dataclass(frozen=True)
class ContextCalibration:
    """The factor set on the cost model and what it came from."""

    factor: float
    predicted_s: float               # sum of the standalone-timed calls of the untransformed step
    times: tuple[float, ...]         # measured seconds of each timed run of its generated program
    eager_times: tuple[float, ...]   # measured seconds of the user's eager step, same rounds
    seconds: float                   # wall time of the calibration (warm-up and binding included)

    @property
    def eager_ratio(self) -> float:
        """Median over the rounds of eager's time / the untransformed program's time."""
        return statistics.median(e / t for e, t in zip(self.eager_times, self.times, strict=True))

    def as_dict(self) -> dict[str, Any]:
        return {"factor": round(self.factor, 4), "predicted_standalone_s": self.predicted_s,
                "untransformed_median_s": statistics.median(self.times),
                "eager_median_s": statistics.median(self.eager_times),
                "eager_ratio": round(self.eager_ratio, 4), "rounds": len(self.times),
                "seconds": round(self.seconds, 3)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def calibrate(g: Graph, cost: MeasuredCostModel, model: torch.nn.Module, batch: Any,
              eager: Callable[[], Any], optimizer: torch.optim.Optimizer | None) -> ContextCalibration:
    """Run `g` untransformed and the user's `eager` step RUNS rounds each (after a warm-up)
    and set cost.context (module doc)."""
    t0 = time.perf_counter()
    cost.context = 1.0
    cost.profile(g)
    predicted = step_seconds(cost, g, g.order)
    step = Step(g, list(g.order))
    times: list[float] = []
    eager_times: list[float] = []
    with Restore(model, optimizer):
        inputs = step.bind(model, batch)
        where = step.device_of(inputs)
        device = next(model.parameters()).device
        eager()                                      # warm-ups (and the optimizer's state)
        step.run(inputs, where)
        for _ in range(RUNS):
            for run, into in ((eager, eager_times), (lambda: step.run(inputs, where), times)):
                _sync(device)
                start = time.perf_counter()
                run()
                _sync(device)
                into.append(time.perf_counter() - start)
    factor = statistics.median(times) / predicted if predicted > 0 else 1.0
    factor = min(HIGHEST, max(LOWEST, factor))
    cost.context = factor
    return ContextCalibration(factor, predicted, tuple(times), tuple(eager_times), time.perf_counter() - t0)
