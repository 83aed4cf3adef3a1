"""Peak memory and time of running a built step, measured three ways.

- "cuda": torch.cuda.max_memory_allocated around one step, less what was allocated before
  it, plus the bytes of the step's inputs (as "cpu-profiler" counts).
- "cpu-profiler": PyTorch has no CPU peak API, so the c10 CPU allocator's
  alloc/free events recorded by torch.profiler (profile_memory=True) are summed
  in order; the peak of that running sum plus the bytes of the step's inputs
  (held by the caller before the call; those a plan keeps in host memory, Graph.host_inputs,
  are not device bytes) is the peak.
- "fake-tracker": the generated program runs over FakeTensors (no memory) under
  a dispatch mode that follows storage allocation and release (weakref
  finalizers on storages), for paper-size models; transient op workspace is
  added from the same workspace model the simulator uses.

Measuring runs real steps; by default parameters, buffers and optimizer state
are restored afterwards so that measuring does not train the model.
"""

from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from peakcut.codegen.program import Step

METHODS = ("cpu-profiler", "cuda", "fake-tracker")


@dataclass(frozen=True)
class Measurement:
    """A measured peak (bytes) and step time (seconds, median over repeats), and how."""

    peak_bytes: int
    seconds: float
    method: str
    device: str
    input_bytes: int
    times: tuple[float, ...] = ()
    host_peak_bytes: int = 0   # swap-outs alive at once in host memory (not in peak_bytes)

    def describe(self) -> str:
        return f"measured ({self.method} on {self.device})"


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages of `tensors` (a storage shared by views counts once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr() if t.device.type != "meta" else id(s)] = s.nbytes()
    return sum(seen.values())


@contextmanager
def _restored(step: Step, model: torch.nn.Module, enabled: bool):
    """Snapshot parameters, buffers and optimizer state; put them back on exit."""
    if not enabled:
        yield
        return
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    state = {k: v.clone() for k, v in step.state.items()}
    try:
        yield
    finally:
        with torch.no_grad():
            for k, v in model.state_dict(keep_vars=True).items():
                v.copy_(saved[k])
            for k, v in step.state.items():
                v.copy_(state[k])


def allocator_events(fn: Callable[[], Any]) -> tuple[list[int], Any]:
    """Signed sizes of the c10 CPU allocator's alloc (+) / free (-) events while fn() runs, in time
    order, and fn's result. Read from torch.profiler's raw kineto events (profile_memory=True)."""
    from peakcut.memory.workspace.profiler import allocator_profile

    with allocator_profile() as prof:
        # only the allocator's events are read: with no op records, a collective started here
        # hands no record for its own thread to close (gloo's worker thread closing a record of
        # this session while this thread writes its own corrupted the heap of a 2-rank FSDP2
        # step measured 40 times in about one run of five)
        torch.autograd._enable_record_function(False)
        try:
            result = fn()
        finally:
            torch.autograd._enable_record_function(True)
    events = [e for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    events.sort(key=lambda e: e.start_ns())
    return [e.nbytes() for e in events], result


def profiler_peak(fn: Callable[[], Any]) -> tuple[int, Any]:
    """(peak of the CPU allocator's running byte count while fn() runs, fn's result)."""
    sizes, result = allocator_events(fn)
    live = peak = 0
    for n in sizes:
        live += n
        peak = max(peak, live)
    return peak, result


def held_input_bytes(step: Step, inputs: list[torch.Tensor]) -> int:
    """Bytes of a bound step's inputs held in device memory by the caller (inputs a plan keeps
    in host memory, Graph.host_inputs, are not device bytes)."""
    host = set(step.graph.host_inputs())
    return storage_bytes([x for x, t in zip(inputs, step.graph.inputs, strict=True) if t not in host])


def run_peak(fn: Callable[[], Any], device: torch.device, held_bytes: int) -> int:
    """Peak device bytes while fn() runs: `held_bytes` (what the caller holds for it) plus the
    most the allocator holds beyond what it held before (CUDA: max_memory_allocated less
    memory_allocated before; CPU: the profiler's allocator events), so that tensors the
    process holds for other purposes do not count."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return held_bytes + int(torch.cuda.max_memory_allocated(device)) - before
    delta, _ = profiler_peak(fn)
    return held_bytes + delta


def bound_peak(step: Step, inputs: list[torch.Tensor], dev: str, input_bytes: int) -> int:
    """Peak device bytes of one run of a bound step whose caller-held inputs take
    `input_bytes` (run_peak), with the step's arena where an earlier run made it (held across
    runs like the inputs; one the run makes is among its allocations)."""
    held = input_bytes + (step.arena.nbytes if step.arena is not None else 0)
    return run_peak(lambda: step.run(inputs, dev), torch.device(dev), held)


def measure(
    step: Step,
    model: torch.nn.Module,
    batch: Any,
    *,
    method: str | None = None,
    repeats: int = 3,
    restore: bool = True,
) -> Measurement:
    """Peak memory and median time of `step(model, batch)`; method defaults by device.

    A model on the meta device (paper size) is measured with the fake tracker.
    """
    device = _device(model, batch)
    if method is None:
        method = {"cuda": "cuda", "meta": "fake-tracker"}.get(device.type, "cpu-profiler")
    if method not in METHODS:
        raise ValueError(f"method={method!r}: expected one of {METHODS}")
    if method == "fake-tracker":
        return fake_tracked_peak(step)
    if method == "cuda" and device.type != "cuda":
        raise ValueError("method='cuda' needs a model on a CUDA device")
    if method == "cpu-profiler" and device.type != "cpu":
        raise ValueError(f"method='cpu-profiler' needs a CPU model, got {device}")

    created = step.ensure_state(model)       # state a first step would create: removed afterwards
    with _restored(step, model, restore):
        inputs = step.bind(model, batch)
        input_bytes = held_input_bytes(step, inputs)
        dev = step.device_of(inputs)
        step.run(inputs, dev)  # warm-up: first-call effects excluded
        times = []
        for _ in range(max(1, repeats)):
            _sync(device)
            t0 = time.perf_counter()
            step.run(inputs, dev)
            _sync(device)
            times.append(time.perf_counter() - t0)
        peak = bound_peak(step, inputs, dev, input_bytes)
    if restore:
        step.update.discard(created)
    return Measurement(peak, statistics.median(times), method, str(device), input_bytes, tuple(times),
                       host_peak_bytes=getattr(step, "host_peak_bytes", 0))


def _device(model: torch.nn.Module, batch: Any) -> torch.device:
    for t in (*model.parameters(), *model.buffers(), *tree_flatten(batch)[0]):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StorageTracker(TorchDispatchMode):
    """Follows live storage bytes op by op (works over FakeTensors)."""

    def __init__(self, workspace: Any = None) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()
        self._workspace = workspace  # callable(func, args, kwargs, outputs) -> bytes, or None

    def track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._seen:
            return
        self._seen.add(key)
        nbytes = int(storage.nbytes())
        self.live += nbytes
        weakref.finalize(storage, self._release, key, nbytes)

    def _release(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = [o for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor)]
        for o in outs:
            self.track(o)
        extra = 0
        if self._workspace is not None:
            extra = self._workspace(func, args, kwargs, outs)
        self.peak = max(self.peak, self.live + extra)
        return out


def fake_tracked_peak(step: Step) -> Measurement:
    """Run the generated program over FakeTensors and track storage bytes (no real memory)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from peakcut.runtime.workspace_hook import workspace_for_call

    g = step.graph
    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    tracker = StorageTracker(workspace_for_call)
    storages: dict[int, torch.Tensor] = {}
    inputs = []
    with fake_mode:
        for tid in g.inputs:
            meta = g.tensors[tid]
            base = storages.get(meta.storage)
            if base is None:
                base = torch.empty(g.storages[meta.storage], dtype=torch.uint8, device=g.device)
                storages[meta.storage] = base
            inputs.append(_view_of(base, meta))
    host = set(g.host_inputs())            # kept in host memory: not device bytes
    for t, tid in zip(inputs, g.inputs, strict=True):
        if tid not in host:
            tracker.track(t)
    input_bytes = tracker.live
    t0 = time.perf_counter()
    with fake_mode, tracker:
        outputs = step.run(inputs, g.device, hp=step.capture_scalars())
    seconds = time.perf_counter() - t0
    del outputs
    return Measurement(tracker.peak, seconds, "fake-tracker", g.device, input_bytes, (seconds,))


def _view_of(base: torch.Tensor, meta: Any) -> torch.Tensor:
    typed = base.view(meta.torch_dtype)
    return typed.as_strided(meta.shape, meta.stride, meta.storage_offset)
