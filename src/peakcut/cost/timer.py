"""Timing calls the way a generated program makes them.

Two methods; both make each call exactly as the program does and drop its result at once,
as the program's ``del`` does.

* **Interleaved** (CPU, the default): the calls of a batch are made one after the other in
  rounds -- ``warmup`` rounds, then ``rounds`` timed rounds -- each call timed on its own with
  time.perf_counter; a call's time is its median over the rounds. Every call thus follows
  *other* ops, as in a program, so it pays what a program pays and a tight loop hides: cold
  instruction cache and branch predictors (interpreter, dispatcher, oneDNN's per-shape JIT
  kernels) and inputs no longer in L1/L2. On the development VM (2-core AMD EPYC), sums of
  loop-timed nodes came out 6-16% below the measured generated programs of the tiny
  workloads (median per workload), sums of interleaved ones at 0.98-1.08 of them.
  Batches shorter than MIN_INTERLEAVED are padded with filler calls. A batch whose round
  is long runs fewer rounds: its warm-up and timed rounds as many as ``batch_seconds``
  holds, at least ``min_rounds`` timed (and one warm-up round where ``warmup`` +
  ``min_rounds`` rounds exceed ``batch_seconds``): a medium-size step's calls take
  milliseconds each, where a median of 3 is as steady as one of 11 of microsecond calls,
  and 13 rounds of them took most of a 90 s budget.
* **Loop** (CUDA, or TimingSettings(interleave=False)): ``warmup`` calls and once more, each
  timed; from the fastest of them a loop length n so that n calls take at least
  ``min_loop_seconds``; the loop is timed ``repeats`` times and the median per-call time kept.
  On CUDA the loop is timed with CUDA events after a synchronize, so a call costs max(host
  issue time, device time), like back-to-back calls in a program.

Busy machines: while another process keeps a core busy, every OpenMP parallel region can wait
a scheduler slice (~16 ms on a 2-core VM) for its worker thread. Timings that look disturbed
-- a loop whose repeats disagree, a round after which a parallel probe is slow (see
time_call, time_interleaved) -- are redone, at most ``retries`` times as many.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

MIN_INTERLEAVED = 16  # shorter batches are padded with filler calls


@dataclass(frozen=True)
class TimingSettings:
    """How the measured model times calls (see the module docstring)."""

    warmup: int = 2
    repeats: int = 5
    min_loop_seconds: float = 2e-4
    max_loop_calls: int = 10_000
    rounds: int = 11
    interleave: bool = True
    max_spread: float = 2.0
    retries: int = 2
    batch_seconds: float = 1.0     # interleaved: the timed rounds of a batch take about this long ...
    min_rounds: int = 3            # ... but at least this many rounds (at most `rounds`)

    def __post_init__(self) -> None:
        if min(self.warmup, self.retries) < 0 or min(self.repeats, self.rounds, self.min_rounds) < 1:
            raise ValueError(f"invalid timing settings {self}")
        if not self.batch_seconds > 0:
            raise ValueError(f"invalid batch_seconds in {self}")
        if self.max_loop_calls < 1 or not self.min_loop_seconds > 0:
            raise ValueError(f"invalid loop settings {self}")


def _cpu_loop(fn: Callable[[], Any], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - start


def _cuda_loop(fn: Callable[[], Any], calls: int, device: torch.device) -> float:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def loop_seconds(fn: Callable[[], Any], calls: int, device: torch.device) -> float:
    """Wall time of `calls` back-to-back calls of fn on `device` (CUDA: with events)."""
    if device.type == "cuda":
        return _cuda_loop(fn, calls, device)
    return _cpu_loop(fn, calls)


WAKE_ELEMENTS = 1 << 16  # above ATen's GRAIN_SIZE (32768): the op runs on every intra-op thread
WAKE_HOT_SECONDS = 1e-3  # a hot call of that size takes tens of microseconds anywhere
WAKE_HOT_CALLS = 10
WAKE_MAX_SECONDS = 0.05
SUSPECT_SECONDS = 1e-3  # a disturbed parallel region costs a scheduler slice: milliseconds


def threads_hot(device: torch.device, calls: int = 2) -> bool:
    """True if `calls` parallel probe calls in a row are fast: the CPU worker threads are awake
    and getting cores (always True on CUDA or with one thread)."""
    if device.type == "cuda" or torch.get_num_threads() == 1:
        return True
    probe = torch.ones(WAKE_ELEMENTS)
    for _ in range(calls):
        start = time.perf_counter()
        probe.add_(1.0)
        if time.perf_counter() - start >= WAKE_HOT_SECONDS:
            return False
    return True


def wake_threads(device: torch.device, max_seconds: float = WAKE_MAX_SECONDS) -> bool:
    """Probe until the CPU threads are hot (threads_hot with WAKE_HOT_CALLS calls), for at most
    `max_seconds`; True if they got there.

    Idle OpenMP workers go to sleep, and on a busy machine a parallel region may wait for its
    worker to get a core. Timings are only trusted while the workers are awake and get
    cores: this brings about (or waits for) that state.
    """
    deadline = time.perf_counter() + max_seconds
    while not threads_hot(device, WAKE_HOT_CALLS):
        if time.perf_counter() > deadline:
            return False
    return True


def time_call(fn: Callable[[], Any], device: torch.device, settings: TimingSettings) -> float:
    """Median seconds per call of fn, loop-timed (see the module docstring).

    An attempt is trusted when its repeats agree within ``settings.max_spread`` (max / min)
    and, if it is slow enough to hide scheduler delays (>= SUSPECT_SECONDS per call), the
    CPU threads are still awake and getting cores afterwards.
    """
    single = min(loop_seconds(fn, 1, device) for _ in range(settings.warmup + 1))
    calls = math.ceil(settings.min_loop_seconds / max(single, 1e-9))
    calls = min(max(calls, 1), settings.max_loop_calls)
    best = math.inf
    for _ in range(1 + settings.retries):
        per_call = [loop_seconds(fn, calls, device) / calls for _ in range(settings.repeats)]
        median = statistics.median(per_call)
        best = min(best, median)
        steady = max(per_call) <= settings.max_spread * min(per_call)
        if steady and (median < SUSPECT_SECONDS or threads_hot(device)):
            break
        wake_threads(device)
    return best


def time_interleaved(calls: Sequence[Callable[[], Any]], device: torch.device,
                     settings: TimingSettings,
                     filler: Sequence[Callable[[], Any]] = (), deadline: float = math.inf) -> list[float]:
    """Median seconds of each call, interleaved in rounds (see the module docstring): warm-up
    and timed rounds as many as ``settings.batch_seconds`` holds at the last warm-up round's
    pace, between ``settings.min_rounds`` and ``settings.rounds`` timed.

    `filler` calls are made after the batch in every round when the batch has fewer than
    MIN_INTERLEAVED calls; they are not timed. A round counts only if the CPU threads are
    still hot right after it (threads_hot); disturbed rounds are replaced, up to
    ``settings.rounds * settings.retries`` extra rounds, and used only if no round was clean.
    After `deadline` (perf_counter) no new round starts once one has been timed.
    """
    sequence = list(calls) + (list(filler) if len(calls) < MIN_INTERLEAVED else [])
    timed = len(calls)
    round_s = 0.0
    warmed = 0
    for _ in range(settings.warmup):
        start = time.perf_counter()
        for fn in sequence:
            fn()
        round_s = time.perf_counter() - start
        warmed += 1
        if round_s * (settings.warmup + settings.min_rounds) > settings.batch_seconds:
            break                                 # a long batch: one warm-up round is enough
    wanted = settings.rounds if round_s <= 0 else max(
        min(settings.min_rounds, settings.rounds),
        min(settings.rounds, int(settings.batch_seconds / round_s) - warmed))
    clean: list[list[float]] = []
    disturbed: list[list[float]] = []
    for _ in range(wanted * (1 + settings.retries)):
        if len(clean) == wanted or ((clean or disturbed) and time.perf_counter() > deadline):
            break
        sample = []
        for fn in sequence:
            start = time.perf_counter()
            fn()
            sample.append(time.perf_counter() - start)
        if threads_hot(device):
            clean.append(sample[:timed])
        else:
            disturbed.append(sample[:timed])
            wake_threads(device)
    rounds = clean or disturbed
    return [statistics.median(r[i] for r in rounds) for i in range(timed)]


def time_calls(calls: Sequence[Callable[[], Any]], device: torch.device,
               settings: TimingSettings,
               filler: Sequence[Callable[[], Any]] = (), deadline: float = math.inf) -> list[float]:
    """Seconds of each call: interleaved on CPU (unless settings.interleave is False),
    loop-timed one by one on CUDA. After `deadline`, interleaved timing stops at the first
    round done (fewer rounds, each call still timed)."""
    if device.type == "cuda" or not settings.interleave:
        return [time_call(fn, device, settings) for fn in calls]
    return time_interleaved(calls, device, settings, filler, deadline)


def copy_call(nbytes: int, direction: str, device: torch.device) -> Callable[[], Any]:
    """A callable doing one copy of `nbytes` bytes in `direction` ("d2h" | "h2d").

    CPU: a plain tensor copy (clone: allocate + memcpy, like peakcut.store / load do).
    CUDA: an asynchronous copy between a pinned host buffer and a device buffer.
    """
    if device.type != "cuda":
        source = torch.zeros(nbytes, dtype=torch.uint8)
        return lambda: source.clone()
    host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    src, dst = (dev, host) if direction == "d2h" else (host, dev)
    return lambda: dst.copy_(src, non_blocking=True)
