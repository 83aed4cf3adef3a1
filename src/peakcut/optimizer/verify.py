"""The limit verified, not assumed: candidate plans run for real, interleaved with eager.

    verdict = verify(candidates, eager_step, model, batch, objective, eager_latency_s, seconds)

When the plan runs on the device it was planned for (a measured cost model on the model's
own device), optimize ends here. Each candidate (the latest bests of the search, newest
first, and the untransformed step last) is built and run; in every round the user's eager
step (loss, backward, clipping, optimizer step, on the user's model and optimizer, state
restored afterwards) and every candidate run once each, in turn, so that drifts of the
machine (frequency, other processes) hit all alike. Time: median over the rounds, with min
and max. Peak: one more run of each under the allocator's account (runtime.measure: the CPU
profiler's events, or cuda max_memory_allocated).

A latency limit was given as a ratio to eager; measured, it is that ratio times eager's
measured median, widened by the noise band the same rounds measured for eager
(interquartile range / median of eager's runs). A memory limit is in bytes and is compared with the
measured peak as is. The verdict picks, among candidates that meet the limit measured, the
one the objective prefers on measured figures (least peak under a latency limit, least time
under a memory limit); none meeting it is LimitNotMet with the measured figures.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from peakcut.codegen.program import Step
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.state import State
from peakcut.runtime.measure import bound_peak, held_input_bytes, profiler_peak

MIN_ROUNDS = 3
MAX_ROUNDS = 7


@dataclass(frozen=True)
class Measured:
    """One program's measured figures: peak bytes and the seconds of each round."""

    name: str
    peak_bytes: int
    times: tuple[float, ...]
    method: str

    @property
    def median_s(self) -> float:
        return statistics.median(self.times)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "peak_bytes": self.peak_bytes, "median_s": self.median_s,
                "min_s": min(self.times), "max_s": max(self.times), "runs": len(self.times),
                "method": self.method}


@dataclass(frozen=True)
class Verdict:
    """What verification found: the chosen candidate (None: none met the limit) and why."""

    chosen: int | None
    eager: Measured
    candidates: tuple[Measured, ...]
    limit: float                     # the limit as measured: seconds (latency) or bytes (memory)
    noise: float                     # eager's noise band over the rounds (noise_band)
    seconds: float                   # wall time of verification

    def meets(self, m: Measured, mode: str) -> bool:
        return m.median_s <= self.limit if mode == "latency" else m.peak_bytes <= self.limit

    def report(self, mode: str) -> dict[str, Any]:
        return {"method": f"measured ({self.eager.method}), {len(self.eager.times)} interleaved rounds",
                "eager": self.eager.as_dict(), "noise_band": self.noise, "limit": self.limit,
                "candidates": [dict(c.as_dict(), meets_limit=self.meets(c, mode)) for c in self.candidates],
                "chosen": None if self.chosen is None else self.candidates[self.chosen].name,
                "seconds": round(self.seconds, 3)}


def eager_runner(model: torch.nn.Module, batch: Any, loss_fn: Callable[..., Any],
                 optimizer: torch.optim.Optimizer | None, max_grad_norm: float | None) -> Callable[[], Any]:
    """One step of the user's eager loop on `model` and `optimizer` (what plan.step stands for)."""
    params = [p for p in model.parameters() if p.requires_grad]

    def run() -> Any:
        for p in params:
            p.grad = None
        loss = loss_fn(model, batch)
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        if optimizer is not None:
            optimizer.step()
        for p in params:
            p.grad = None
        return loss.detach()

    return run


class _Restore:
    """Parameters, buffers and optimizer state as they were on entry (verification trains nothing)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model, self.optimizer = model, optimizer

    def __enter__(self) -> None:
        self.saved = {k: v.detach().clone() for k, v in self.model.state_dict(keep_vars=True).items()}
        self.grads = {id(p): p.grad for p in self.model.parameters()}
        self.state = copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None

    def __exit__(self, *exc: object) -> None:
        with torch.no_grad():
            for k, v in self.model.state_dict(keep_vars=True).items():
                v.copy_(self.saved[k])
        for p in self.model.parameters():
            p.grad = self.grads.get(id(p))
        if self.optimizer is not None and self.state is not None:
            self.optimizer.load_state_dict(self.state)
            if not self.state["state"]:
                self.optimizer.state.clear()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _eager_peak(run: Callable[[], Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Peak bytes of one eager step: what the caller holds (parameters, buffers, optimizer
    state) plus the allocator's peak while it runs."""
    device = _device(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        run()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device))
    held: dict[int, int] = {}
    tensors = [*model.parameters(), *model.buffers()]
    if optimizer is not None:
        tensors += [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    for t in tensors:
        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    peak, _ = profiler_peak(run)
    return sum(held.values()) + peak


def noise_band(times: Sequence[float]) -> float:
    """Relative spread of repeated runs of one program: interquartile range / median (robust
    to the odd run another process slowed down)."""
    median = statistics.median(times)
    if len(times) < 2 or median <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / median


RUNS_BESIDE_ROUNDS = 3
"""Runs of each program outside the timed rounds: warm-up, peak, and (eager) the optimizer's
first step; with building and binding each candidate, about one run more."""


def rounds_for(seconds_each: float, programs: int, budget: float) -> int:
    """Interleaved rounds that fit `budget` (at least MIN_ROUNDS, at most MAX_ROUNDS)."""
    if seconds_each <= 0:
        return MAX_ROUNDS
    fit = int(budget / (seconds_each * programs)) - RUNS_BESIDE_ROUNDS
    return max(MIN_ROUNDS, min(MAX_ROUNDS, fit))


def programs_for(seconds_each: float, budget: float, most: int) -> int:
    """How many candidates (at least 1, at most `most`) can run MIN_ROUNDS rounds beside eager
    within `budget`."""
    if seconds_each <= 0:
        return most
    fit = int(budget / (seconds_each * (MIN_ROUNDS + RUNS_BESIDE_ROUNDS))) - 1
    return max(1, min(most, fit))


def verify(candidates: Sequence[tuple[str, Step]], model: torch.nn.Module, batch: Any,
           eager: Callable[[], Any], optimizer: torch.optim.Optimizer | None, objective: Objective,
           predicted_eager_s: float, rounds: int) -> Verdict:
    """Run eager and every candidate `rounds` times, interleaved, and judge them (module doc)."""
    t0 = time.perf_counter()
    device = _device(model)
    method = "cuda" if device.type == "cuda" else "cpu-profiler"
    times: list[list[float]] = [[] for _ in range(len(candidates) + 1)]
    peaks: list[int] = []
    with _Restore(model, optimizer):
        eager()                                      # warm-up (and the optimizer's state)
        eager_peak = _eager_peak(eager, model, optimizer)
        bound = []
        for _, step in candidates:
            created = step.ensure_state(model)
            inputs = step.bind(model, batch)
            dev = step.device_of(inputs)
            step.run(inputs, dev)                    # warm-up
            peaks.append(bound_peak(step, inputs, dev, held_input_bytes(step, inputs)))
            bound.append((step, inputs, dev, created))
        runs: list[Callable[[], Any]] = [eager, *(lambda b=b: b[0].run(b[1], b[2]) for b in bound)]
        for _ in range(rounds):
            for i, run in enumerate(runs):
                _sync(device)
                start = time.perf_counter()
                run()
                _sync(device)
                times[i].append(time.perf_counter() - start)
        for step, _, _, created in bound:
            step.update.discard(created)
    eager_m = Measured("eager", eager_peak, tuple(times[0]), method)
    cands = tuple(Measured(name, peak, tuple(times[i + 1]), method)
                  for i, ((name, _), peak) in enumerate(zip(candidates, peaks, strict=True)))
    noise = noise_band(times[0])
    if objective.mode == "latency":
        ratio = objective.limit / predicted_eager_s if predicted_eager_s > 0 else 1.0
        limit = ratio * eager_m.median_s * (1 + noise)
    else:
        limit = objective.limit
    verdict = Verdict(None, eager_m, cands, limit, noise, time.perf_counter() - t0)
    meeting = [i for i, c in enumerate(cands) if verdict.meets(c, objective.mode)]
    if meeting:
        pick = (min(meeting, key=lambda i: (cands[i].peak_bytes, cands[i].median_s)) if objective.mode == "latency"
                else min(meeting, key=lambda i: (cands[i].median_s, cands[i].peak_bytes)))
        verdict = Verdict(pick, eager_m, cands, limit, noise, time.perf_counter() - t0)
    return verdict


def runs_here(cost: Any, model: torch.nn.Module) -> bool:
    """Whether plans priced by `cost` run on the device they were planned for: a measured cost
    model (peakcut.cost.measured) measuring on `model`'s device type."""
    from peakcut.cost.measured import MeasuredCostModel
    from peakcut.optimizer.budget import BudgetedCost

    if isinstance(cost, BudgetedCost):
        cost = cost.measured
    return isinstance(cost, MeasuredCostModel) and cost.device.type == _device(model).type


def candidate_name(state: State, root: State) -> str:
    if state is root:
        return "untransformed step"
    return f"{len(state.applied)} transformations ({state.peak_bytes:,} B, {state.latency_s * 1e3:.1f} ms predicted)"


def choose(candidates: Sequence[State], root: State, objective: Objective, predicted_eager_s: float,
           model: torch.nn.Module, batch: Any, eager: Callable[[], Any],
           optimizer: torch.optim.Optimizer | None, seconds: float) -> tuple[State, Verdict]:
    """Run `candidates` against eager within about `seconds` and pick one (module doc). With
    no candidate meeting the limit, the one nearest to it (least measured time under a latency
    limit, least measured peak under a memory limit) comes back with the verdict's chosen None."""
    steps = [(candidate_name(s, root), Step(s.program, list(s.order))) for s in candidates]
    rounds = rounds_for(predicted_eager_s, len(steps) + 1, seconds)
    verdict = verify(steps, model, batch, eager, optimizer, objective, predicted_eager_s, rounds)
    if verdict.chosen is not None:
        return candidates[verdict.chosen], verdict
    measured = verdict.candidates
    near = (min(range(len(measured)), key=lambda i: measured[i].median_s) if objective.mode == "latency"
            else min(range(len(measured)), key=lambda i: measured[i].peak_bytes))
    return candidates[near], verdict
