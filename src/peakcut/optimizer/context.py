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

The program runs RUNS times after a warm-up and SETTLE untimed rounds, interleaved with the
user's eager step, on the
user's model and optimizer, which are restored afterwards (peakcut.optimizer.verify.Restore);
the median is used. Each run is a whole call, step(model, batch), as plan.step makes it and
as verification times a candidate (bind included), so that the rounds of both can be pooled
(refit). The factor is kept within [LOWEST, HIGHEST]: outside it the runs
measured something else (a busy machine), not the step.

The same rounds give the reference of a latency limit: the user asked for a ratio to their
eager loop, not to the generated program, which may run faster (no module hooks, no
autograd bookkeeping) or slower. eager_ratio = eager's fastest round / the untransformed
program's fastest; the limit is that ratio times the predicted time of the untransformed
step (both now in the calibrated model's seconds). Fastest, not median: the first eager
steps after the calls' own timing still run slow while memory is faulted in (medium
BTLM-3B: 3.0, 2.1, then 1.64 s, against 1.7, 2.6, 1.7 s for the program), and the
median of 3 rounds gave eager_ratio 1.37, a search allowed 37% more time than the user's
limit; a minimum is also the steadiest figure against a shared machine's noise, which only
slows a run (refit, docs/cost.md).

Inside a time budget the calibration must not eat it: the step's distinct calls are
measured for at most `measure_seconds` (the calls the analytic profile prices highest first,
the highest of each family before the others;
the rest are priced by fitted prices and measured during the search, peakcut.optimizer.budget),
and the rounds run only when every call was measured and they fit in what is left of
`seconds`; otherwise they are deferred (``skipped`` says why, ``deferred`` is True): factor
and eager_ratio stay 1, and verification's rounds, which run eager and the untransformed
step side by side anyway, give the floor and the level (refit). On this CPU at medium size
(steps of 1.2-2 s) the rounds take 15-20 s, a fifth of a 90 s budget. The calls' workspace
(peakcut.memory.workspace: on a CPU each distinct call run once under the profiler) is
measured here too, so that it counts as calibration rather than as the search's first
simulation.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from peakcut.codegen.program import Step
from peakcut.cost.measured import MeasuredCostModel
from peakcut.cost.model import step_seconds
from peakcut.ir.graph import Graph
from peakcut.memory.workspace import order_workspace
from peakcut.optimizer.budget import BudgetedCost
from peakcut.optimizer.verify import (
    EagerReference,
    EagerStep,
    Restore,
    Verdict,
    eager_reference,
    model_device,
    sync_device,
)
from peakcut.spec.constants import bound_constants

RUNS = 3
SETTLE = 1
"""Untimed rounds of eager and the program after their warm-ups, before the timed ones: the
allocator's heap grows to fit both ways of allocating over the first rounds (medium BTLM-3B:
eager 3.0, 2.1, then 1.64 s with one warm-up each)."""
LOWEST, HIGHEST = 0.8, 1.6
RUNS_MARGIN = 1.2
"""The runs after the calls' timing are reserved this x (2 * (RUNS + SETTLE) + 2) times the
first eager step (a warm-up of both, SETTLE and RUNS rounds of both); the step's calls are
measured in what is left of the calibration's seconds (the search needs them measured
anyway). Whether the rounds still fit is decided on the program's predicted time, once the
calls are measured: eager's first step, which makes the optimizer's state and faults its
memory in, took 5 s where a step takes 1.8 (medium GPT-Neo), and even its second step after
the calls' timing can be twice a settled one (medium BTLM-3B: 3.9 s against 1.65)."""


@dataclass(frozen=True)
class ContextCalibration:
    """The factor set on the cost model and what it came from."""

    factor: float = 1.0
    predicted_s: float = 0.0               # sum of the standalone-timed calls of the untransformed step
    times: tuple[float, ...] = ()        # measured seconds of each timed run of its generated program
    eager_times: tuple[float, ...] = ()  # measured seconds of the user's eager step, same rounds
    seconds: float = 0.0                 # wall time of the calibration (warm-up and binding included)
    skipped: str = ""                    # why nothing was run (factor and eager_ratio 1)
    eager_step_s: float = 0.0            # a warm eager step: the fastest of eager_times, or where the
    # rounds did not run, step_estimate's (what reserving verification needs)
    deferred: bool = False               # skipped for the budget: verification's rounds refit instead
    measure_s: float = 0.0               # of `seconds`, measuring the step's calls
    workspace_s: float = 0.0             # of `seconds`, measuring their workspace (memory.workspace)
    unmeasured: int = 0                  # the step's distinct calls left to fitted prices
    reference: EagerReference | None = field(default=None, repr=False)   # eager's first step's numbers

    @property
    def eager_ratio(self) -> float:
        """Eager's fastest round / the untransformed program's fastest (module doc)."""
        if not self.times:
            return 1.0
        return min(self.eager_times) / min(self.times)

    def as_dict(self) -> dict[str, Any]:
        if self.skipped:
            return {"factor": 1.0, "eager_ratio": 1.0, "skipped": self.skipped, "deferred": self.deferred,
                    "seconds": round(self.seconds, 3), "measure_s": round(self.measure_s, 3),
                    "workspace_s": round(self.workspace_s, 3), "unmeasured_calls": self.unmeasured,
                    "eager_step_s": round(self.eager_step_s, 3)}
        measured = statistics.median(self.times) / self.predicted_s if self.predicted_s > 0 else 1.0
        return {"factor": round(self.factor, 4), "measured_factor": round(measured, 4),
                "predicted_standalone_s": self.predicted_s,
                "untransformed_median_s": statistics.median(self.times),
                "eager_median_s": statistics.median(self.eager_times),
                "eager_ratio": round(self.eager_ratio, 4), "rounds": len(self.times),
                "seconds": round(self.seconds, 3), "measure_s": round(self.measure_s, 3),
                "workspace_s": round(self.workspace_s, 3)}


def calibrate(g: Graph, cost: MeasuredCostModel, model: torch.nn.Module, batch: Any,
              eager: EagerStep, optimizer: torch.optim.Optimizer | None,
              seconds: float = math.inf, measure_seconds: float | None = None) -> ContextCalibration:
    """Run `g` untransformed and the user's `eager` step RUNS rounds each (after a warm-up)
    and set cost.context (module doc), within about `seconds`. The first eager step (the
    warm-up) is timed and the rounds are reserved from it (RUNS_MARGIN); its numbers are the
    numbers check's reference (`reference`: verify.eager_reference); the step's calls are
    measured in the rest, for at most `measure_seconds` (default: all of it), the calls
    priced highest first; the model's step then prices the rounds. When the calls cannot all
    be measured, or the rounds would not fit in what is left, nothing more runs (factor 1, the
    reason in `skipped`, `deferred` True; step_estimate's step in `eager_step_s`, from the
    calls measured and fitted prices for the rest, so that optimize can still keep the time
    verifying a plan takes). Otherwise a second eager step warms eager up again before them."""
    t0 = time.perf_counter()
    cost.context = 1.0
    times: list[float] = []
    eager_times: list[float] = []
    device = model_device(model)
    with Restore(model, optimizer, bound_constants(g.input_names, model)) as restore:
        # the warm-up (and the optimizer's state), and the numbers check's reference (verify)
        reference, first = eager_reference(eager, model, optimizer, restore)
        reserved = RUNS_MARGIN * (2 * (RUNS + SETTLE) + 2) * first
        t_measure = time.perf_counter()
        limit = seconds - reserved if measure_seconds is None else measure_seconds
        cost.profile(g, deadline=t_measure + max(0.0, limit), largest_first=True)
        measure_s = time.perf_counter() - t_measure
        t_workspace = time.perf_counter()     # the workspace model measures the step's calls on first
        order_workspace(g, list(g.order), "auto")   # use: here, in the calibration's seconds, not the search's
        workspace_s = time.perf_counter() - t_workspace
        unmeasured = len({cost.job(g, n).key for n in g.order if not cost.known(g, n)})
        if unmeasured:
            # what a step takes, for the verification's share: the calls measured and the
            # rest at fitted prices (peakcut.optimizer.budget), nothing more run
            predicted = step_seconds(BudgetedCost(cost, t_measure), g, g.order)
            return ContextCalibration(skipped=f"{unmeasured} of the step's calls were not measured within "
                                      f"{max(0.0, limit):.1f} s (they are priced by fitted prices and "
                                      "measured during the search; verification's rounds give the floor)",
                                      seconds=time.perf_counter() - t0, eager_step_s=step_estimate(first, predicted),
                                      deferred=True, measure_s=measure_s, workspace_s=workspace_s,
                                      unmeasured=unmeasured, reference=reference)
        predicted = step_seconds(cost, g, g.order)
        need = RUNS_MARGIN * (2 * (RUNS + SETTLE) + 2) * predicted   # a settled eager step takes about
        # what the program does (eager_ratio 0.95-1.05)
        left = seconds - (time.perf_counter() - t0)
        if need > left:
            return ContextCalibration(skipped=f"running the step {RUNS + SETTLE + 1} times and eager "
                                      f"{RUNS + SETTLE + 1} times takes "
                                      f"about {need:.1f} s; {max(0.0, left):.1f} s left for it (verification's "
                                      "rounds give the floor)",
                                      seconds=time.perf_counter() - t0,
                                      eager_step_s=step_estimate(first, predicted), deferred=True,
                                      measure_s=measure_s, workspace_s=workspace_s, reference=reference)
        eager()                                       # warm again after the calls' own timing
        step = Step(g, list(g.order))
        step(model, batch)                            # warm-up
        for _ in range(SETTLE):
            eager()
            step(model, batch)
        for _ in range(RUNS):
            eager_times.append(_timed(eager, device))
            times.append(_timed(lambda: step(model, batch), device))
    factor = statistics.median(times) / predicted if predicted > 0 else 1.0
    factor = min(HIGHEST, max(LOWEST, factor))
    cost.context = factor
    return ContextCalibration(factor, predicted, tuple(times), tuple(eager_times), time.perf_counter() - t0,
                              eager_step_s=min(eager_times), measure_s=measure_s, workspace_s=workspace_s,
                              reference=reference)


def step_estimate(first: float, predicted: float) -> float:
    """What a warm eager step takes, for sizing verification where the calibration's rounds
    did not run: the step the model predicts (`predicted`), or the first eager step where
    that is less (or nothing was predicted). The first step makes the optimizer's state and
    faults its memory in (medium GPT-Neo: 5 s where a step takes 1.8), and a second one right
    after the calls' own timing still runs slow (medium BTLM-3B: 4.7 s where verification's
    rounds ran 2.4-3.8 s and the model predicts 3.4 s), so the model's figure is the nearer one."""
    return min(first, predicted) if predicted > 0 else first


def refit(model_ratio: float, calibration: ContextCalibration | None, verdict: Verdict,
          untransformed: str) -> dict[str, Any] | None:
    """The kept plan's predicted time re-stated after verification (docs/cost.md).

    `model_ratio` is the cost model's time of the plan / of the untransformed step: the model
    predicts that ratio, and the level comes from the rounds run. The floor (the untransformed
    program's time / eager's) is measured over every round that ran both: the calibration's
    before the search and the verification's, when it timed the untransformed step (named
    `untransformed`); as the ratio of the fastest run of each. On a shared machine
    noise only slows a run down, so a minimum is the steadiest figure of a program's own time
    (bench.floor, 11 rounds on seven workloads: ratios of minima x0.95-x1.01, medians of
    per-round ratios x0.79-x1.02), where a few rounds' median was off by 10% either way: a
    medium ResNet-50 verification's 5 rounds gave x0.891 (bench.floor: x1.013), and a medium
    BERT-base calibration's 3 rounds pulled the median of all its rounds to x0.905 where the
    verification's alone gave x0.952. latency_ratio = model_ratio x floor;
    latency_s = that ratio x eager's median in the verification's rounds, the nearest in time
    to when the plan runs (also when the untransformed step was not run: a memory limit's
    candidates). None when no round ran both, or verification timed no eager run."""
    programs = [] if calibration is None else list(calibration.times)
    eagers = [] if calibration is None else list(calibration.eager_times)
    seen = next((m for m in verdict.candidates if m.name == untransformed), None)
    if seen is not None:
        programs += seen.times
        eagers += verdict.eager.times
    if not programs or not verdict.eager.times or model_ratio <= 0:
        return None
    floor = min(programs) / min(eagers)
    ratio = model_ratio * floor
    return {"latency_s": ratio * verdict.eager.median_s, "latency_ratio": ratio, "model_ratio": model_ratio,
            "floor": floor, "floor_method": "fastest untransformed run / fastest eager run",
            "floor_rounds": len(programs), "floor_rounds_verification": 0 if seen is None else len(seen.times),
            "eager_measured_s": verdict.eager.median_s, "rounds": len(verdict.eager.times)}


def _timed(run: Callable[[], Any], device: torch.device) -> float:
    """Seconds `run` takes, the device synchronized before and after."""
    sync_device(device)
    start = time.perf_counter()
    run()
    sync_device(device)
    return time.perf_counter() - start
