"""The limit verified, not assumed: candidate plans run for real, interleaved with eager.

    state, verdict, placed = choose(candidates, root, objective, predicted_eager_s, model, batch, eager, opt, seconds)

When the plan runs on the device it was planned for (a measured cost model on the model's
own device), optimize ends here. Each candidate (the latest bests of the search, newest
first, and the untransformed step last) is built and bound to the user's optimizer and its
state, as plan.step binds them. Under a latency limit the untransformed step is the reserve:
its numbers are checked, its peak measured and it is timed only when no other candidate met
the limit itself (its rounds then follow theirs, interleaved with eager again): it is the
plan of last resort, and running it beside a plan that met the limit was a third of
verification's runs. First each candidate's numbers: its first step against eager's, both from
the state and RNG the user's objects had on entry (peakcut.optimizer.numbers); a candidate
whose numbers differ is left out, the value and by how much in Verdict.numbers. Then, in
every round (MIN_ROUNDS to MAX_ROUNDS, as the time left allows) the user's eager step
(loss, backward, clipping, optimizer step, on the user's model and optimizer; parameters,
buffers, grads, optimizer state and the RNG restored afterwards) and every candidate run
once each, in turn, so that drifts of the machine (frequency, other processes) hit all
alike (SHORT_ROUNDS where the time left holds no more). Time: median over the rounds, with
min and max. A candidate's time is a whole call,
step(model, batch), as plan.step makes it: its bind (checking model, batch and optimizer,
reading the hyper-parameters), the program, and the optimizer's step counts (on an H200 at paper size,
ResNet-50's plan timed as its program alone verified at x1.068 and ran at x1.126 from
plan.step; bench.gpu). A candidate that keeps parameters or optimizer state in host memory
moves them there when it binds; after each of its runs they are put back (Layout, untimed),
so that eager runs on the user's layout, and an untimed bind before each timed call moves
them again (plan.step does that once). Peak: one more run of each under the allocator's account
(runtime.measure.bound_peak: the CPU profiler's events, or cuda max_memory_allocated
beyond what was allocated before; a candidate's arena, where it runs with one, counts as
held: runtime.measure.bound_peak). A candidate that cannot bind or run is left out, and
the reason reported. The user's optimizer hooks run on the eager rounds like on any step;
a candidate refuses an optimizer with step hooks, as plan.step does (reported as failed).

A latency limit was given as a ratio to eager, and is checked as one: a candidate's time is
the median over the rounds of its time / eager's time in the same round (a round's
interference hits both), against the ratio itself first (pick_candidate), and only when no
candidate meets that, against the ratio widened by the noise band the same rounds measured
for eager (interquartile range / median of eager's runs, at most MAX_NOISE).
A memory limit is in bytes and is compared with the measured peak as is. The verdict picks, among candidates that meet the limit measured, the
one the objective prefers on measured figures (least peak under a latency limit, least time
under a memory limit); none meeting it (or none left to run) is LimitNotMet with the
measured figures.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from peakcut.codegen.arena_plan import ArenaPlan
from peakcut.codegen.program import Step
from peakcut.cost.inputs import error_line
from peakcut.optimizer.numbers import (
    NumbersCheck,
    StepNumbers,
    Tolerance,
    check,
    float32_math,
    take,
    tolerance_for,
)
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.state import State
from peakcut.optimizer.user_step import EagerStep, Layout, Restore, model_device, sync_device
from peakcut.runtime.measure import bound_peak, held_input_bytes, run_peak, storage_bytes
from peakcut.spec.constants import bound_constants

MIN_ROUNDS = 5
MAX_ROUNDS = 9
SHORT_ROUNDS = 3
"""Rounds when the time left holds fewer than MIN_ROUNDS (a step of seconds in a budget of
a minute or two: eager, one plan and the untransformed step 5 rounds each took half of it)."""
MAX_NOISE = 0.25
"""The widest noise band a latency limit is widened by: noisier rounds prove nothing."""


@dataclass(frozen=True)
class Measured:
    """One program's measured figures: peak bytes and the seconds of each round."""

    name: str
    peak_bytes: int
    times: tuple[float, ...]
    method: str
    ratio: float = 1.0
    """Median over the rounds of its time / eager's time in the same round (eager: 1)."""

    @property
    def median_s(self) -> float:
        return statistics.median(self.times)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "peak_bytes": self.peak_bytes, "median_s": self.median_s,
                "ratio_to_eager": self.ratio,
                "min_s": min(self.times), "max_s": max(self.times), "runs": len(self.times),
                "method": self.method}


@dataclass(frozen=True)
class Verdict:
    """What verification found: the chosen candidate (None: none met the limit) and why."""

    chosen: int | None
    eager: Measured
    candidates: tuple[Measured, ...]
    limit: float                     # the limit as measured: a ratio to eager (latency) or bytes (memory)
    noise: float                     # eager's noise band over the rounds (noise_band)
    seconds: float                   # wall time of verification
    ran: tuple[int, ...] = ()        # index in the candidates given of each of `candidates`
    failed: tuple[tuple[str, str], ...] = ()   # (candidate, why) of those that could not run
    strict_limit: float | None = None   # latency: the ratio before the noise band widened it
    numbers: NumbersCheck | None = None  # each candidate's first step against eager's (numbers.py)
    reserve: str = ""                    # why a latency limit's reserve was not timed ('' where it was, or none)

    def meets(self, m: Measured, mode: str) -> bool:
        return _meets(m, mode, self.limit)

    def report(self, mode: str) -> dict[str, Any]:
        return {"method": f"measured ({self.eager.method}), {len(self.eager.times)} interleaved rounds",
                "eager": self.eager.as_dict(), "noise_band": self.noise, "limit": self.limit,
                "strict_limit": self.strict_limit,
                "candidates": [dict(c.as_dict(), meets_limit=self.meets(c, mode),
                                    **({} if self.strict_limit is None or mode != "latency"
                                       else {"within_strict_limit": c.ratio <= self.strict_limit}))
                               for c in self.candidates],
                "chosen": None if self.chosen is None else self.candidates[self.chosen].name,
                "failed": [{"name": n, "why": w} for n, w in self.failed],
                **({} if self.numbers is None else {"numbers": self.numbers.report()}),
                **({"reserve": self.reserve} if self.reserve else {}),
                "seconds": round(self.seconds, 3)}


def _eager_peak(run: Callable[[], Any], model: torch.nn.Module, batch: Any,
                optimizer: torch.optim.Optimizer | None) -> int:
    """Peak bytes of one eager step: what the caller holds (parameters, buffers, optimizer
    state, the batch) plus the most the allocator holds beyond that while it runs."""
    tensors = [*model.parameters(), *model.buffers(), *(t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor))]
    if optimizer is not None:
        tensors += [t for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    device = model_device(model)
    return run_peak(run, device, storage_bytes([t for t in tensors if t.device == device]))


def noise_band(times: Sequence[float]) -> float:
    """Relative spread of repeated runs of one program: interquartile range / median (robust
    to the odd run another process slowed down), at most MAX_NOISE."""
    median = statistics.median(times)
    if len(times) < 2 or median <= 0:
        return 0.0
    q1, _, q3 = statistics.quantiles(times, n=4)
    return min(MAX_NOISE, (q3 - q1) / median)


EAGER_BESIDE_ROUNDS = 2
"""Runs of eager outside the timed rounds: the numbers check and the peak (the last
candidate's numbers check leaves the state a warm-up would: the optimizer's state made)."""
CANDIDATE_BESIDE_ROUNDS = 2
"""Runs of a candidate outside the timed rounds: the numbers check (its warm-up) and the peak."""


RESERVE_TIMED_RUNS = 2 + 2 * SHORT_ROUNDS
"""Runs the reserve takes where the plans miss: its numbers check, its peak run and
SHORT_ROUNDS rounds with eager (where a plan meets the limit, none)."""


def runs_needed(programs: int, rounds: int) -> int:
    """Steps verifying takes: eager and `programs` - 1 candidates, `rounds` rounds each (a
    latency limit's reserve aside: RESERVE_TIMED_RUNS, only where the plans miss)."""
    return EAGER_BESIDE_ROUNDS + rounds + (programs - 1) * (CANDIDATE_BESIDE_ROUNDS + rounds)


def rounds_for(seconds_each: float, programs: int, budget: float) -> int:
    """Interleaved rounds that fit `budget` (at least SHORT_ROUNDS, at most MAX_ROUNDS)."""
    if seconds_each <= 0:
        return MAX_ROUNDS
    fixed = EAGER_BESIDE_ROUNDS + (programs - 1) * CANDIDATE_BESIDE_ROUNDS
    fit = int((budget / seconds_each - fixed) / programs)
    return max(SHORT_ROUNDS, min(MAX_ROUNDS, fit))


def programs_for(seconds_each: float, budget: float, most: int, reserve: bool = False) -> int:
    """How many candidates besides eager and the untransformed step (at least 1, at most
    `most`) can run MIN_ROUNDS rounds within `budget`, the untransformed step with them; where
    it is the `reserve` (a latency limit), without it: it runs when they all miss the limit,
    in what their rounds leave (choose)."""
    if seconds_each <= 0:
        return most
    fit = 1
    while fit < most and runs_needed(fit + 3 - reserve, MIN_ROUNDS) * seconds_each <= budget:
        fit += 1
    return fit


def verify(candidates: Sequence[tuple[str, Step]], model: torch.nn.Module, batch: Any,
           eager: EagerStep, optimizer: torch.optim.Optimizer | None, objective: Objective,
           predicted_eager_s: float, rounds: int, deadline: float = math.inf,
           reserve_s: float | None = None, reference: EagerReference | None = None) -> Verdict:
    """Check every candidate's numbers against eager's (peakcut.optimizer.numbers), then run
    eager and every candidate that matched up to `rounds` times, interleaved, and judge them
    (module doc). Past SHORT_ROUNDS, no round starts that the last round's time says would end
    after `deadline` (perf_counter): steps slower than the rounds were sized on end early. A candidate that
    fails to bind or run (out of memory, say) is left out, with the reason in Verdict.failed;
    one whose numbers differ from eager's too, with the reason in Verdict.numbers. reserve_s:
    under a latency limit, the last candidate is the reserve (module doc), timed only where no
    other met the limit itself with a peak below eager's; the others' rounds end `reserve_s`
    before the deadline, which its peak run and SHORT_ROUNDS rounds take. reference: eager's
    numbers from the entry state, taken already (eager_reference), which eager does not run for."""
    t0 = time.perf_counter()
    device = model_device(model)
    method = "cuda" if device.type == "cuda" else "cpu-profiler"
    ran: list[int] = []
    peaks: list[int] = []
    for _, step in candidates:               # the user's optimizer and its state, as plan.step binds them
        if optimizer is not None and step.optimizer is not optimizer:
            step.update.attach(optimizer)
    constants = bound_constants(candidates[0][1].graph.input_names, model) if candidates else []
    strict = (objective.limit / predicted_eager_s if predicted_eager_s > 0 else 1.0) \
        if objective.mode == "latency" else None
    lazy = reserve_s is not None and strict is not None and len(candidates) > 1
    rng = _rng_state(device) if reference is None else reference.rng
    # of every candidate's graph, the reserve's too: the same tolerance whenever it is checked
    tolerance = tolerance_for((step.graph for _, step in candidates), float32_math(device))
    with Restore(model, optimizer, constants) as restore:
        # the reserve's numbers too only where it is timed (below)
        numbers = _check_numbers(candidates[:-1] if lazy else candidates, model, batch, eager, optimizer, restore,
                                 rng, None if reference is None else reference.numbers, tolerance)
        failed = [(name, why) for _, name, why in numbers.failed]
        if not numbers.stepped:     # the last candidate's step is the warm-up where it stands
            eager()                                  # warm-up (and the optimizer's state)
        eager_peak = _eager_peak(eager, model, batch, optimizer)
        layout = Layout(model, optimizer)
        every = [*range(len(candidates))]
        groups = [(every[:-1], deadline - (reserve_s or 0.0)), (every[-1:], deadline)] if lazy else [(every, deadline)]
        eager_times: list[float] = []
        noise_times: list[float] = []                          # eager's runs beside the plans
        timed: list[tuple[list[float], list[float]]] = []      # (eager's runs in its rounds, its runs)
        reserve = ""
        try:
            for group, until in groups:
                if _a_plan_met(timed, peaks, strict, eager_peak):
                    reserve = (f"{candidates[-1][0]} not run: a plan met the limit with less than eager's peak "
                               "(nor its numbers checked)")
                    break
                if lazy and group is groups[-1][0]:
                    later = _check_numbers(candidates[-1:], model, batch, eager, optimizer, restore, rng,
                                           numbers.reference, tolerance, first=len(candidates) - 1)
                    failed += [(name, why) for _, name, why in later.failed]
                    numbers = numbers.with_more(later)
                bound = _bound(group, candidates, numbers.passed, model, batch, layout, failed)
                ran += [index for index, _, _ in bound]
                peaks += [peak for _, peak, _ in bound]
                if not bound and (eager_times or group is not groups[-1][0]):
                    continue                                # (eager's rounds run once, alone if need be)
                times = _rounds(eager, [step for _, _, step in bound], model, batch, device, layout, rounds, until)
                eager_times += times[0]
                noise_times = noise_times or times[0]
                timed += [(times[0], t) for t in times[1:]]
        finally:
            layout.put_back()
    eager_m = Measured("eager", eager_peak, tuple(eager_times), method)
    cands = tuple(Measured(candidates[index][0], peak, tuple(t), method, _ratio(t, e))
                  for index, peak, (e, t) in zip(ran, peaks, timed, strict=True))
    noise = noise_band(noise_times)
    limit = objective.limit if strict is None else strict * (1 + noise)
    pick = pick_candidate(cands, objective.mode, limit, strict)
    return Verdict(pick, eager_m, cands, limit, noise, time.perf_counter() - t0, tuple(ran), tuple(failed),
                   strict_limit=strict, numbers=numbers, reserve=reserve)


def _ratio(times: Sequence[float], eager_times: Sequence[float]) -> float:
    """Median over the rounds of a program's time / eager's in the same round."""
    return statistics.median(c / e for c, e in zip(times, eager_times, strict=True))


def _a_plan_met(timed: Sequence[tuple[Sequence[float], Sequence[float]]], peaks: Sequence[int],
                strict: float | None, eager_peak: int) -> bool:
    """Whether a program timed so far met a latency limit itself with a peak below eager's."""
    return strict is not None and any(_ratio(c, e) <= strict and peak < eager_peak
                                      for (e, c), peak in zip(timed, peaks, strict=True))


def _bound(group: Sequence[int], candidates: Sequence[tuple[str, Step]], passed: frozenset[int],
           model: torch.nn.Module, batch: Any, layout: Layout, failed: list[tuple[str, str]]
           ) -> list[tuple[int, int, Step]]:
    """(index, measured peak, step) of each candidate in `group` whose numbers passed, each
    bound as plan.step binds it and run once under the allocator's account (warm: the numbers
    check ran it); one that raises (out of memory first) goes to `failed`, and the others
    are still judged."""
    found = []
    for index in group:
        name, step = candidates[index]
        if index not in passed:
            continue
        try:
            inputs = step.bind(model, batch)
            found.append((index, bound_peak(step, inputs, step.device_of(inputs), held_input_bytes(step, inputs)),
                          step))
        except Exception as e:
            failed.append((name, error_line(e)))
        finally:
            layout.put_back()
    return found


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The CPU RNG's state and `device`'s where it is a GPU."""
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


@dataclass(frozen=True)
class EagerReference:
    """Eager's numbers of one step from the user's entry state, and the RNG it ran from:
    what the numbers check compares candidates with (taken once, by the calibration's first
    eager step, so that verification does not run eager for it again)."""

    numbers: StepNumbers
    rng: tuple[torch.Tensor, torch.Tensor | None]


def eager_reference(eager: EagerStep, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    restore: Restore) -> tuple[EagerReference, float]:
    """Run the user's eager step once from `restore`'s entry state (which it must be in) and
    take its numbers; the reference, and the step's seconds (the fingerprints aside). The
    state the step left stays; its gradients are set to None, as the user's loop leaves them."""
    device = model_device(model)
    rng = _rng_state(device)
    sync_device(device)
    t0 = time.perf_counter()
    loss = eager.run(keep_grads=True)             # (it sets the grads to None first)
    sync_device(device)
    seconds = time.perf_counter() - t0
    numbers = take(loss, model, optimizer, restore.entry())
    for p in eager.params:
        p.grad = None
    return EagerReference(numbers, rng), seconds


def _check_numbers(candidates: Sequence[tuple[str, Step]], model: torch.nn.Module, batch: Any, eager: EagerStep,
                   optimizer: torch.optim.Optimizer | None, restore: Restore,
                   rng: tuple[torch.Tensor, torch.Tensor | None], ref: StepNumbers | None = None,
                   tolerance: Tolerance | None = None, first: int = 0) -> NumbersCheck:
    """The numbers check (peakcut.optimizer.numbers): every run from the entry state, the
    entry layout and the entry RNG (`rng`, _rng_state's), which are all there again after
    each run but the last candidate's where it matched: the state that step left, in the
    entry layout, is eager's warm-up (numbers.check: settle). With `ref`, against those
    numbers of eager's (an EagerReference's or an earlier check's): eager does not run;
    `tolerance`: default, the candidates' (numbers.tolerance_for); `first`: the index of
    candidates[0] among those verify was given."""
    layout = Layout(model, optimizer)
    device = model_device(model)
    cpu_rng, gpu_rng = rng

    def reset() -> None:
        layout.put_back()
        restore.put_back()
        torch.set_rng_state(cpu_rng)
        if gpu_rng is not None:
            torch.cuda.set_rng_state(gpu_rng, device)

    tolerance = tolerance or tolerance_for((step.graph for _, step in candidates), float32_math(device))
    return check(candidates, model, batch, lambda: eager.run(keep_grads=True), optimizer, restore.entry(), reset,
                 tolerance, restore.nbytes, settle=layout.put_back, ref=ref, first=first)


def pick_candidate(cands: Sequence[Measured], mode: str, limit: float, strict: float | None = None) -> int | None:
    """The candidate the objective prefers (least peak under a latency limit, least time under
    a memory limit) among those that meet `limit` as measured; None when none does. Under a
    latency limit those whose median ratio meets the limit itself (`strict`, before eager's
    noise band widened it) come first: a plan accepted only within the band ran over the
    limit when measured again (ResNet-50 at medium size in bench.measured: x1.147 under
    1.10), so the band decides only when no candidate meets the limit itself."""
    def best(pool: list[int]) -> int | None:
        if not pool:
            return None
        if mode == "latency":
            return min(pool, key=lambda i: (cands[i].peak_bytes, cands[i].ratio))
        return min(pool, key=lambda i: (cands[i].ratio, cands[i].peak_bytes))

    if mode == "latency" and strict is not None:
        found = best([i for i, c in enumerate(cands) if c.ratio <= strict])
        if found is not None:
            return found
    return best([i for i, c in enumerate(cands) if _meets(c, mode, limit)])


def _rounds(eager: Callable[[], Any], steps: Sequence[Step], model: torch.nn.Module, batch: Any,
            device: torch.device, layout: Layout, rounds: int, deadline: float) -> list[list[float]]:
    """Seconds of eager (first) and of every step in each round. A step's time is a whole
    call, step(model, batch), as plan.step makes it (bind, program, the optimizer's step
    counts). An untimed bind before it moves what the plan keeps in host memory there again
    (plan.step does that once), and the layout is put back after it, for eager."""
    times: list[list[float]] = [[] for _ in range(len(steps) + 1)]
    runs: list[Callable[[], Any]] = [eager, *(partial(step, model, batch) for step in steps)]
    round_s = 0.0
    for r in range(rounds):
        if r >= SHORT_ROUNDS and time.perf_counter() + round_s > deadline:
            break
        begun = time.perf_counter()
        for i, run in enumerate(runs):
            if i > 0:
                steps[i - 1].bind(model, batch)
            sync_device(device)
            start = time.perf_counter()
            run()
            sync_device(device)
            times[i].append(time.perf_counter() - start)
            if i > 0:
                layout.put_back()
        round_s = time.perf_counter() - begun
    return times


def _meets(m: Measured, mode: str, limit: float) -> bool:
    return m.ratio <= limit if mode == "latency" else m.peak_bytes <= limit


def runs_here(cost: Any, model: torch.nn.Module) -> bool:
    """Whether plans priced by `cost` run on the device they were planned for: a measured cost
    model (peakcut.cost.measured) measuring on `model`'s device."""
    from peakcut.cost.measured import MeasuredCostModel
    from peakcut.optimizer.budget import BudgetedCost

    if isinstance(cost, BudgetedCost):
        cost = cost.measured
    if not isinstance(cost, MeasuredCostModel):
        return False
    device = model_device(model)
    return cost.device.type == device.type and (device.type == "cpu" or cost.device.index == device.index)


def candidate_name(state: State, root: State) -> str:
    if state is root:
        return "untransformed step"
    return f"{len(state.applied)} transformations ({state.peak_bytes:,} B, {state.latency_s * 1e3:.1f} ms predicted)"


def choose(candidates: Sequence[State], root: State, objective: Objective, predicted_eager_s: float,
           model: torch.nn.Module, batch: Any, eager: EagerStep,
           optimizer: torch.optim.Optimizer | None, seconds: float,
           step_s: float | None = None, arenas: Sequence[bool | ArenaPlan] = (),
           reference: EagerReference | None = None) -> tuple[State, Verdict, ArenaPlan | None]:
    """Run `candidates` against eager within about `seconds` and pick one (module doc); the
    rounds are sized on `step_s` seconds a step (default: `predicted_eager_s`). arenas: each
    candidate's arena (True: the one its Step plans; an ArenaPlan: that one; none given: no
    arena), which its runs use and its measured peak counts. With no candidate meeting the
    limit, the one nearest to it (least measured time under a latency limit, least measured
    peak under a memory limit; the first given if none ran) comes back with the verdict's
    chosen None. Also the arena plan the state ran with (None without one)."""
    deadline = time.perf_counter() + seconds          # building the candidates (their arenas) counts
    placed = list(arenas) or [False] * len(candidates)
    if len(placed) != len(candidates):
        raise ValueError(f"{len(placed)} arenas for {len(candidates)} candidates")
    steps = [(candidate_name(s, root), Step(s.program, list(s.order), arena=a))
             for s, a in zip(candidates, placed, strict=True)]
    # under a latency limit the untransformed step (last) is the reserve, timed only where
    # needed, in what the others' rounds leave: its peak run and the fewest rounds with eager
    each = predicted_eager_s if step_s is None else step_s
    reserve = objective.mode == "latency" and len(candidates) > 1 and candidates[-1] is root
    reserve_s = RESERVE_TIMED_RUNS * each if reserve else None
    rounds = rounds_for(each, len(steps) + 1 - reserve, max(0.0, deadline - time.perf_counter() - (reserve_s or 0.0)))
    verdict = verify(steps, model, batch, eager, optimizer, objective, predicted_eager_s, rounds,
                     deadline=deadline, reserve_s=reserve_s, reference=reference)
    measured = verdict.candidates
    if verdict.chosen is not None:
        index = verdict.ran[verdict.chosen]
    elif not measured:
        index = 0
    else:
        near = (min(range(len(measured)), key=lambda i: measured[i].ratio) if objective.mode == "latency"
                else min(range(len(measured)), key=lambda i: measured[i].peak_bytes))
        index = verdict.ran[near]
    return candidates[index], verdict, steps[index][1].arena_plan
