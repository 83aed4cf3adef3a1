"""The measured cost model: every distinct call timed on the local device, cached on disk.

A node costs the measured latency of its call key (op, tensor layouts, other arguments; see
peakcut.cost.calls) plus the per-line overhead a generated program pays on top of that
(calibrated once per machine; see peakcut.cost.overhead). Calls are made the way the
generated program makes them: ``torch.ops.aten.<op>.<overload>(*args, **kwargs)`` under
torch.no_grad(), with the result dropped each time. Inputs: see peakcut.cost.inputs; timing
(interleaved on CPU, looped on CUDA): see peakcut.cost.timer. New keys are measured in
batches -- all new keys of a graph in profile(g), one key on a node_seconds miss (padded with
the filler mix of peakcut.cost.mix) -- holding at most ``max_batch_bytes`` of inputs at once,
and calls priced (fitted_seconds) at most MAX_BATCH_SECONDS a round, so that a deadline cuts
a measurement between batches of about a second at most.

A call that cannot run standalone (it raises on synthetic data, or its tensors exceed
``max_input_bytes``) is priced by the analytic profile of the device instead ("cpu", or the
closest GPU profile) and recorded as an estimate: ``fallbacks`` counts the keys this model
answered that way and ``fallback_reasons`` says why. Swap nodes (peakcut.store / load) cost
the time of copying their bytes (copy_seconds).

Measuring uses a forked RNG state, so random ops being timed do not change the caller's RNG.

Calls not measured yet can be priced at once, nothing run: fitted_seconds prices a node from
the measured calls of its family (peakcut.cost.fitted; every measured entry keeps the work a
fit reads, in the cache too), and measure(jobs, deadline) times chosen calls later: a search
on a cold cache runs on fitted prices while its new calls are measured between its
expansions (peakcut.optimizer.budget).

``context`` (default 1.0) multiplies every figure: the in-context slowdown of one captured
step, measured by running it untransformed (peakcut.optimizer.context), because ops timed
one at a time run faster than the same ops inside a whole step (docs/cost.md). It is a
property of one step on one machine, so it lives on the instance, never in the cache.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from peakcut.cost.analytic import AnalyticCostModel
from peakcut.cost.cache import SCHEMA_VERSION, CostCache, CostEntry
from peakcut.cost.calls import call_key, copy_key, is_swap, node_work, swap_transfer
from peakcut.cost.fingerprint import device_fingerprint
from peakcut.cost.fitted import COPY_FAMILY, FittedPrices, Work
from peakcut.cost.inputs import (
    VALUE_CHECKED_OPS,
    CallSpec,
    call_bytes,
    call_spec,
    error_line,
    spec_call,
)
from peakcut.cost.mix import mix_calls, mix_operands
from peakcut.cost.overhead import line_overhead_seconds
from peakcut.cost.profiles import DeviceProfile, check_direction, cpu_profile, profile_for_gpu_name
from peakcut.cost.timer import TimingSettings, copy_call, time_calls, wake_threads
from peakcut.ir.graph import Graph

DEFAULT_MAX_INPUT_BYTES = 1 << 30
DEFAULT_MAX_BATCH_BYTES = 1 << 28
MAX_BATCH_SECONDS = 0.25
"""A batch's calls are priced at most this much together (one round: the batch takes a
warm-up and at least three rounds, peakcut.cost.timer)."""
LEAST_RUNS = 4
"""A call is run at least this many times when measured (trial, warm-up, rounds): one whose
price that many times does not fit before a deadline is not started."""
WORK_MEMO_LIMIT = 1 << 15
"""Keys whose work fitted_seconds keeps (emptied past it)."""


@dataclass(frozen=True)
class Job:
    """One key to measure: how to build its call, how to estimate it, how big it is, the
    work a fit reads of it, and its call as plain data (a CallSpec, or a copy's bytes and
    direction)."""

    key: str
    build: Callable[[], Callable[[], Any]]
    estimate: Callable[[], float]
    nbytes: int
    work: Callable[[], Work]
    call: Callable[[], CallSpec | tuple[int, str]]


@dataclass(frozen=True)
class JobSpec:
    """A Job as plain data, which pickles: a forked search's call, measured by its parent
    (MeasuredCostModel.spec_of, job_from)."""

    key: str
    call: CallSpec | tuple[int, str]
    estimate: float
    nbytes: int
    work: Work


def _timing_device(device: str | torch.device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"cannot measure on {dev}: torch.cuda.is_available() is False")
        return torch.device("cuda", dev.index if dev.index is not None else
                            torch.cuda.current_device())
    if dev.type != "cpu":
        raise ValueError(f"cannot measure on {dev}: expected a cpu or cuda device")
    return dev


def _fallback_profile(device: torch.device) -> DeviceProfile:
    if device.type == "cuda":
        return profile_for_gpu_name(torch.cuda.get_device_name(device))
    return cpu_profile(torch.get_num_threads())


class MeasuredCostModel:
    """Per-op latency measured on `device` ("cpu" or "cuda[:i]"), cached per fingerprint.

    cache_dir: where the cache file lives (default $PEAKCUT_CACHE/costs). line_overhead:
    add the calibrated per-line program overhead to every non-swap node (default True).
    """

    def __init__(
        self,
        device: str | torch.device = "cpu",
        *,
        cache_dir: str | Path | None = None,
        settings: TimingSettings | None = None,
        max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        line_overhead: bool = True,
    ) -> None:
        self.device = _timing_device(device)
        self.name = f"measured:{self.device.type}"
        self.overlap_copies = self.device.type == "cuda"
        self.settings = settings if settings is not None else TimingSettings()
        self.max_input_bytes = max_input_bytes
        self.max_batch_bytes = max_batch_bytes
        self.use_line_overhead = line_overhead
        self.context = 1.0  # in-context slowdown of the step being planned (peakcut.optimizer.context)
        self.measurements = 0  # keys timed (or found untimeable) by this instance
        self._cache = CostCache(device_fingerprint(self.device, SCHEMA_VERSION),
                                Path(cache_dir) if cache_dir is not None else None)
        self._table = self._cache.load()
        self._fit = FittedPrices()
        for entry in self._table.entries.values():
            if entry.work is not None and not entry.estimated:
                self._fit.add(entry.work, entry.seconds)
        self._works: dict[str, Work] = {}     # key -> work, for fitted_seconds
        self._fallback = AnalyticCostModel(_fallback_profile(self.device))
        # nodes on the host beside a GPU: the rough CPU profile of this machine's threads
        self._host = None if self.device.type == "cpu" else AnalyticCostModel(cpu_profile(torch.get_num_threads()))
        self._estimated: dict[str, str] = {}  # key -> reason, for keys this model answered
        self._filler: list[Callable[[], Any]] = []  # built on first use

    # ------------------------------------------------------------------ queries
    @property
    def cache_path(self) -> Path:
        """The JSON file this model reads and writes."""
        return self._cache.path

    @property
    def fallbacks(self) -> int:
        """How many distinct keys this model priced with the analytic estimate."""
        return len(self._estimated)

    @property
    def fallback_reasons(self) -> dict[str, str]:
        """Key -> why it could not be measured, for the keys counted in `fallbacks`."""
        return dict(self._estimated)

    @property
    def line_overhead_seconds(self) -> float:
        """Per-line program overhead added to every non-swap node (calibrated on first use)."""
        if not self.use_line_overhead:
            return 0.0
        if self._table.line_overhead_seconds is None:
            with self._timing():
                self._table.line_overhead_seconds = line_overhead_seconds(
                    self.device, self.settings)
            self._cache.save(self._table)
        return self._table.line_overhead_seconds

    def node_seconds(self, g: Graph, nid: int) -> float:
        """Latency of node `nid`; measured (and cached) on the first miss. Beside a GPU, a node
        on the host is priced by the analytic CPU profile of this machine's threads."""
        if self._host is not None and g.nodes[nid].tags.on_host:
            return self._host.node_seconds(g, nid)
        if is_swap(g, nid):
            return self.copy_seconds(*swap_transfer(g, nid))
        return self.standalone_seconds(g, nid) * self.context

    def standalone_seconds(self, g: Graph, nid: int) -> float:
        """Latency of node `nid` as timed on its own (no in-context factor)."""
        if is_swap(g, nid):
            return self._seconds(self._copy_job(*swap_transfer(g, nid)))
        return self._seconds(self._node_job(g, nid)) + self.line_overhead_seconds

    def known(self, g: Graph, nid: int) -> bool:
        """True when node `nid`'s call is in the table (node_seconds will not measure)."""
        key = copy_key(*swap_transfer(g, nid)) if is_swap(g, nid) else call_key(g, nid)
        return key in self._table.entries

    def estimate(self, g: Graph, nid: int) -> float:
        """The analytic estimate this model falls back to for node `nid` (nothing is measured)."""
        if is_swap(g, nid):
            return self._fallback.copy_seconds(*swap_transfer(g, nid)) * self.context
        return (self._fallback.node_seconds(g, nid) + (self._table.line_overhead_seconds or 0.0)) * self.context

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        """Time of one host<->device copy of `nbytes` bytes (CPU: a plain tensor copy)."""
        return self._seconds(self._copy_job(nbytes, direction)) * self.context

    # ------------------------------------------------------------------ fitted prices
    def job(self, g: Graph, nid: int) -> Job:
        """What measuring node `nid`'s call takes (its key: Job.key); nothing is run."""
        return self._copy_job(*swap_transfer(g, nid)) if is_swap(g, nid) else self._node_job(g, nid)

    def copy_job(self, nbytes: int, direction: str) -> Job:
        """What measuring a host<->device copy of `nbytes` bytes takes; nothing is run."""
        return self._copy_job(nbytes, direction)

    def on_host(self, g: Graph, nid: int) -> bool:
        """True when node `nid` runs on the host beside a GPU (priced by the analytic CPU
        profile, never measured)."""
        return self._host is not None and g.nodes[nid].tags.on_host

    def has(self, key: str) -> bool:
        """True when call key `key` is in the table."""
        return key in self._table.entries

    def spec_of(self, job: Job) -> JobSpec:
        """`job` as plain data (nothing is run)."""
        return JobSpec(job.key, job.call(), job.estimate(), job.nbytes, self._work_of(job))

    def job_from(self, spec: JobSpec) -> Job:
        """The Job of a JobSpec (another process's call, measured here)."""
        return Job(spec.key, lambda: self._build(spec.call), lambda: spec.estimate, spec.nbytes, lambda: spec.work,
                   lambda: spec.call)

    def _build(self, call: CallSpec | tuple[int, str]) -> Callable[[], Any]:
        """The call to time on this model's device: a node's, or a copy's (bytes, direction)."""
        if not isinstance(call, CallSpec):
            return copy_call(*call, self.device)
        op = call.node.op
        if self.device.type == "cuda" and op in VALUE_CHECKED_OPS:
            raise ValueError(f"{op} checks its input values with device-side asserts: not run on synthetic inputs")
        return spec_call(call, self.device)

    def entries_of(self, keys: list[str]) -> dict[str, CostEntry]:
        """The table's entries of `keys` (those in it)."""
        return {k: self._table.entries[k] for k in keys if k in self._table.entries}

    def adopt(self, entries: dict[str, CostEntry]) -> int:
        """Take entries this device's model measured in another process (a forked search's
        calls, measured by its parent) into the table and the fitted prices; how many were new."""
        new = 0
        for key, entry in entries.items():
            if key in self._table.entries:
                continue
            self._table.entries[key] = entry
            if entry.work is not None and not entry.estimated:
                self._fit.add(entry.work, entry.seconds)
            self._note(key)
            new += 1
        return new

    @property
    def fit_points(self) -> int:
        """How many measured calls the fitted prices are made from."""
        return self._fit.points

    def fitted_seconds(self, job: Job) -> tuple[float, str]:
        """The price of `job`'s call from the measured calls of its family (nothing run), as
        node_seconds would give it (line overhead, context), and how it was found
        (FittedPrices.price: "fitted", "scaled" or "analytic")."""
        work = self._work_of(job)
        seconds, how = self._fit.price(work)
        if not work.family.startswith(COPY_FAMILY):
            seconds += self.line_overhead_seconds
        return seconds * self.context, how

    def _work_of(self, job: Job) -> Work:
        work = self._works.get(job.key)
        if work is None:
            if len(self._works) >= WORK_MEMO_LIMIT:
                self._works.clear()
            work = self._works[job.key] = job.work()
        return work

    def measure(self, jobs: list[Job], deadline: float = math.inf) -> int:
        """Measure the calls of `jobs` not in the table yet (none started after `deadline`) and
        save; returns how many keys are in the table now that were not."""
        new = [j for j in {j.key: j for j in jobs}.values() if j.key not in self._table.entries]
        if not new:
            return 0
        self._measure(new, deadline)
        self._cache.save(self._table)
        return sum(1 for j in new if j.key in self._table.entries)

    # ------------------------------------------------------------------ measuring
    def profile(self, g: Graph, deadline: float = math.inf, largest_first: bool = False) -> int:
        """Measure every distinct key of `g` not yet known; returns how many were new. No new
        batch of keys is started after `deadline` (perf_counter): those stay unknown; a batch
        running then stops after its current round of timings. largest_first: the calls the
        analytic profile prices highest first, the highest of each family before the others
        (a deadline then leaves cheap calls of families measured already)."""
        jobs: dict[str, Job] = {}
        for nid in g.order:
            if is_swap(g, nid):
                job = self._copy_job(*swap_transfer(g, nid))
            else:
                job = self._node_job(g, nid)
            if job.key in self._table.entries:
                self._note(job.key)
            else:
                jobs.setdefault(job.key, job)
        if jobs:
            todo = list(jobs.values())
            if largest_first:
                todo = self._coverage_first(todo)
            self._measure(todo, deadline)
            self._cache.save(self._table)
        _ = self.line_overhead_seconds  # calibrate now, not during the first query
        return len(jobs)

    def _coverage_first(self, jobs: list[Job]) -> list[Job]:
        """`jobs` priced highest first, but the highest of each family before any other: a
        deadline then leaves every family a measured point, whose own scale prices the rest
        (peakcut.cost.fitted), rather than another family's."""
        ranked = sorted(jobs, key=lambda j: -j.estimate())
        seen: set[str] = set()
        first: list[Job] = []
        rest: list[Job] = []
        for job in ranked:
            family = self._work_of(job).family
            (rest if family in seen else first).append(job)
            seen.add(family)
        return first + rest

    def save(self) -> None:
        """Write the table to the cache file now."""
        self._cache.save(self._table)

    def _node_job(self, g: Graph, nid: int) -> Job:
        def work() -> Work:
            found = node_work(g, nid)
            return Work(f"{g.nodes[nid].op}:{found.dtype}", float(found.flops), float(found.bytes),
                        self._fallback.node_seconds(g, nid))

        return Job(call_key(g, nid), lambda: self._build(call_spec(g, nid)), lambda: self._fallback.node_seconds(g, nid),
                   call_bytes(g, nid), work, lambda: call_spec(g, nid))

    def _copy_job(self, nbytes: int, direction: str) -> Job:
        check_direction(direction)
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        return Job(copy_key(nbytes, direction), lambda: self._build((nbytes, direction)),
                   lambda: self._fallback.copy_seconds(nbytes, direction), 2 * nbytes,
                   lambda: Work(f"copy:{direction}", 0.0, float(nbytes), self._fallback.copy_seconds(nbytes, direction)),
                   lambda: (nbytes, direction))

    def _seconds(self, job: Job) -> float:
        """Seconds of one job's key, measuring (and saving) it on a miss."""
        if job.key not in self._table.entries:
            self._measure([job])
            self._cache.save(self._table)
        self._note(job.key)
        return self._table.entries[job.key].seconds

    def _note(self, key: str) -> None:
        entry = self._table.entries[key]
        if entry.estimated:
            self._estimated[key] = entry.reason

    def _measure(self, jobs: list[Job], deadline: float = math.inf) -> None:
        """Measure `jobs` (new keys) in batches of at most max_batch_bytes of tensors and
        MAX_BATCH_SECONDS of priced calls, none started after `deadline`, nor one whose price
        LEAST_RUNS times would end past it (a batch being built then is still timed: its
        calls have run once already)."""
        with self._timing():
            batch: list[tuple[Job, Callable[[], Any]]] = []
            held, priced = 0, 0.0
            for job in jobs:
                now = time.perf_counter()
                if now > deadline:
                    break
                price = self._fit.price(self._work_of(job))[0]
                if now + LEAST_RUNS * price > deadline:      # it would run past it: left to the fit
                    continue
                call = self._runnable(job)
                if call is None:
                    continue
                if batch and (held + job.nbytes > self.max_batch_bytes or priced + price > MAX_BATCH_SECONDS):
                    self._time_batch(batch, deadline)
                    batch, held, priced = [], 0, 0.0
                batch.append((job, call))
                held += job.nbytes
                priced += price
            if batch:
                self._time_batch(batch, deadline)
        for job in jobs:
            if job.key in self._table.entries:
                self._note(job.key)

    def _runnable(self, job: Job) -> Callable[[], Any] | None:
        """The job's call after one successful trial; None (and an estimate) if it fails."""
        if job.nbytes > self.max_input_bytes:
            self._record_estimate(job, f"tensors of {job.nbytes} bytes exceed max_input_bytes")
            return None
        try:
            call = job.build()
            call()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)     # an asynchronous error is this call's
        # Any op may reject synthetic inputs in its own way (RuntimeError, IndexError,
        # NotImplementedError, ...): whatever it raises, the key gets an estimate instead.
        except Exception as e:
            self._record_estimate(job, error_line(e))
            return None
        return call

    def _record_estimate(self, job: Job, reason: str) -> None:
        self._table.entries[job.key] = CostEntry(
            job.estimate(), estimated=True, reason=f"{reason} (estimated by {self._fallback.name})")
        self.measurements += 1

    def _time_batch(self, batch: list[tuple[Job, Callable[[], Any]]], deadline: float = math.inf) -> None:
        if not self._filler:
            self._filler = list(mix_calls(mix_operands(self.device)))
        seconds = time_calls([call for _, call in batch], self.device, self.settings,
                             filler=self._filler, deadline=deadline)
        for (job, _), value in zip(batch, seconds, strict=True):
            work = self._work_of(job)
            self._table.entries[job.key] = CostEntry(value, work=work)
            self._fit.add(work, value)
            self.measurements += 1

    @contextlib.contextmanager
    def _timing(self) -> Iterator[None]:
        """No autograd (as generated programs run), a forked RNG state, awake CPU threads."""
        devices = [self.device.index] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.no_grad():
            wake_threads(self.device)
            yield

    def __repr__(self) -> str:
        return f"MeasuredCostModel({self.name!r}, cache={str(self.cache_path)!r})"
