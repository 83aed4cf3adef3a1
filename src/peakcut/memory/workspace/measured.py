"""The CPU workspace model calibrated on the machine at hand: every distinct call measured.
(CalibratedWorkspace, the table, its file and the measuring loop, is shared with the GPU's
model in cuda.py.)

    model = CalibratedCpuWorkspace.for_this_machine()     # what the spec "cpu" resolves to
    model.nodes_bytes(g, nodes)                            # measures the calls it has not seen

A call's workspace is what the c10 CPU allocator holds at the call's peak beyond what is
still held when it returns (its outputs): the running sum of the allocator's alloc/free
events recorded by torch.profiler (profile_memory=True) while the call runs, minus its
final value. Each distinct call (peakcut.cost.calls.call_key: op, tensor layouts, other
arguments) is run once for real on synthetic inputs (peakcut.cost.inputs), warmed up first
so that one-time effects (oneDNN primitive creation, lazy initialisation) are not counted,
then measured; all new calls of a graph are measured in one profiler session. Results are
cached on disk per machine fingerprint (CPU model, threads, ISA, oneDNN settings, default
dtype, PyTorch version: workspace_fingerprint), in
``$PEAKCUT_CACHE/workspace/cpu-<hash>.json``, so a machine measures a call once.

The analytic CPU rules (peakcut.memory.workspace.rules, fitted to one AVX-512 CPU) answer
only where nothing can be measured: a call whose tensors exceed ``max_call_bytes`` (most
calls of paper-size models) or a call that raises on synthetic inputs; each entry records
which answered, and why; only measured entries are written to disk. Nothing is measured while a torch.profiler session runs (a
session of our own would end the caller's) or while the process runs on other intra-op
threads than the model's machine (a forked search worker runs on one thread while it models
its parent's, and raising its thread count after a fork can hang OpenMP): the rules answer
those calls and the table keeps nothing (the graph's own caches do).
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import record_function

from peakcut.cost.cache import CacheFormatError, cache_root, checked_entries, load_json, save_json
from peakcut.cost.calls import call_key
from peakcut.cost.fingerprint import Fingerprint, device_fingerprint
from peakcut.cost.inputs import call_bytes, error_line, real_call
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node
from peakcut.ir.registry import resolve_op
from peakcut.memory.workspace.machine import CpuMachine
from peakcut.memory.workspace.profiler import allocator_profile
from peakcut.memory.workspace.rules import workspace_ops

SCHEMA_VERSION = 1
DEFAULT_MAX_CALL_BYTES = 64 << 20
"""Calls whose tensors (inputs + outputs) exceed this are answered by the rules, not run."""
MAX_BATCH_BYTES = 256 << 20
"""Synthetic inputs held at once while measuring."""
_MARK = "peakcut-workspace-"


@dataclass(frozen=True)
class WorkspaceEntry:
    """Workspace bytes of one call key; ``measured`` False when the rules answered (``reason``)."""

    nbytes: int
    measured: bool = True
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"bytes": self.nbytes, "measured": self.measured, "reason": self.reason}


def _entry(key: str, value: Any) -> WorkspaceEntry:
    if not isinstance(value, dict):
        raise CacheFormatError(f"entry {key!r} is {type(value).__name__}, expected an object")
    nbytes, measured, reason = value.get("bytes"), value.get("measured"), value.get("reason")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise CacheFormatError(f"entry {key!r} bytes is {nbytes!r}, expected an integer >= 0")
    if not isinstance(measured, bool) or not isinstance(reason, str):
        raise CacheFormatError(f"entry {key!r} has a non-bool 'measured' or non-str 'reason'")
    return WorkspaceEntry(nbytes, measured, reason)


def _parse(data: Any, fingerprint: Fingerprint) -> dict[str, WorkspaceEntry]:
    entries = checked_entries(data, fingerprint, SCHEMA_VERSION)
    return {str(k): _entry(str(k), v) for k, v in entries.items()}


@functools.cache
def _may_allocate(op: str) -> bool:
    """An ATen op that can allocate when it runs: not a view, not an out= variant."""
    if not op.startswith("aten."):
        return False
    try:
        schema = resolve_op(op)._schema
    except (AttributeError, RuntimeError, ValueError):
        return False
    if any(a.is_out for a in schema.arguments):
        return False
    return not any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


def measure_calls(calls: Sequence[Callable[[], Any]], warm_up: bool = True) -> list[int]:
    """Workspace bytes of each call (see the module docstring), measured in one profiler session.

    Every call is run once before the session (warm-up; warm_up=False when the caller has
    just run each); inside it each runs in its own record_function range, its result kept
    alive until the range has closed.
    """
    if warm_up:
        for call in calls:
            call()
    with allocator_profile() as prof:
        for i, call in enumerate(calls):
            with record_function(f"{_MARK}{i}"):
                result = call()
            del result
    ranges: dict[int, tuple[int, int]] = {}
    memory: list[tuple[int, int]] = []
    for e in prof.profiler.kineto_results.events():
        name = e.name()
        if name == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU:
            memory.append((e.start_ns(), e.nbytes()))
        elif name.startswith(_MARK):
            ranges[int(name[len(_MARK):])] = (e.start_ns(), e.start_ns() + e.duration_ns())
    memory.sort()
    stamps = [t for t, _ in memory]
    out = []
    for i in range(len(calls)):
        start, end = ranges[i]
        live = peak = 0
        for _, n in memory[bisect.bisect_left(stamps, start):bisect.bisect_right(stamps, end)]:
            live += n
            peak = max(peak, live)
        out.append(max(0, peak - live))
    return out


def workspace_fingerprint() -> Fingerprint:
    """The machine a measured workspace belongs to: the timing fingerprint (CPU model,
    threads, ISA PyTorch dispatches to, PyTorch version) plus what else picks kernels or
    dtypes: oneDNN on/off and its ISA cap (ONEDNN_MAX_CPU_ISA), torch's default dtype."""
    base = device_fingerprint(torch.device("cpu"), SCHEMA_VERSION)
    machine = CpuMachine.current()
    extra = (f"; onednn {'on' if machine.onednn else 'off'} (ONEDNN_MAX_CPU_ISA="
             f"{os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}), default dtype {machine.default_dtype}")
    return Fingerprint(device=base.device + extra, torch=base.torch, schema=base.schema)


class CalibratedWorkspace(ABC):
    """Workspace of calls measured on one device, cached on disk per fingerprint: the table,
    its file and the measuring loop. A subclass says how one batch of calls is measured
    (_record), whether it can measure now (can_measure) and names itself (describe)."""

    machine: CpuMachine | None = None
    """The CPU whose analytic rules answer where nothing is measured (None: 0 bytes then)."""
    spec = ""
    """The workspace spec that names this kind of model ("cpu", "cuda")."""

    def __init__(self, fingerprint: Fingerprint, path: Path, max_call_bytes: int, device: torch.device) -> None:
        self.fingerprint = fingerprint
        self.path = path
        self.max_call_bytes = max_call_bytes
        self.device = device
        self.key: tuple[Any, ...] = ("calibrated", self.spec, fingerprint, max_call_bytes)
        self._entries: dict[str, WorkspaceEntry] = load_json(
            path, lambda data: _parse(data, fingerprint), dict, "workspace cache")

    @abstractmethod
    def describe(self) -> str:
        """Which model this is, for reports."""

    @abstractmethod
    def can_measure(self) -> bool:
        """Whether calls can be measured now (else the fallback answers and nothing is kept)."""

    @abstractmethod
    def _record(self, batch: list[tuple[str, Callable[[], Any]]]) -> None:
        """Measure each (key, call) of `batch` (each has just run once) into the table."""

    def _why_not_run(self, op: str, size: int) -> str:
        """Why a call of `op` holding `size` bytes of tensors is not run here ('' to run it)."""
        return ""

    def _trial(self, call: Callable[[], Any]) -> None:
        """Run `call` once (its warm-up); raise what running it raises."""
        call()

    def table_summary(self) -> str:
        """How many calls the table holds, measured and answered otherwise, for describe()."""
        measured = sum(e.measured for e in self._entries.values())
        return (f"its table holds {measured} measured calls and {len(self._entries) - measured} answered "
                f"otherwise (over {self.max_call_bytes >> 20} MiB or not runnable)")

    def applies(self, op: str) -> bool:
        """Whether nodes of `op` can have workspace (others take 0 without a lookup)."""
        return _may_allocate(op) or op in workspace_ops()

    def entries(self) -> dict[str, WorkspaceEntry]:
        """Call key -> entry, of every call this machine has answered (a copy)."""
        return dict(self._entries)

    def nodes_bytes(self, g: Graph, nodes: Sequence[Node],
                    rules: Callable[[Node], int]) -> list[int]:
        """Workspace of each node; `rules(node)` answers where nothing can be measured."""
        keys = [call_key(g, n.id) for n in nodes]
        new = {k: n for k, n in zip(keys, nodes, strict=True) if k not in self._entries}
        if new and not self.can_measure():
            return [self._entries[k].nbytes if k in self._entries else rules(n)
                    for k, n in zip(keys, nodes, strict=True)]
        if new:
            self._measure(g, new, rules)
            if any(self._entries[k].measured for k in new):   # the rules' answers are not saved
                self._save()
        return [self._entries[k].nbytes for k in keys]

    def _save(self) -> None:
        """Write the measured entries, merged with those another process wrote meanwhile (the
        rules' answers stay in this process: a later run with a higher cap, or without the
        error, measures them)."""
        on_disk: dict[str, WorkspaceEntry] = load_json(self.path, lambda data: _parse(data, self.fingerprint), dict, "workspace cache")
        merged = {**on_disk, **{k: e for k, e in self._entries.items() if e.measured}}
        save_json(self.path, {"schema": SCHEMA_VERSION, "fingerprint": self.fingerprint.as_dict(),
                              "entries": {k: e.as_dict() for k, e in sorted(merged.items())}})

    def _measure(self, g: Graph, new: dict[str, Node], rules: Callable[[Node], int]) -> None:
        batch: list[tuple[str, Callable[[], Any]]] = []
        held = 0
        with quiet(self.device):
            for key, node in new.items():
                size = call_bytes(g, node.id)
                if size > self.max_call_bytes:
                    self._entries[key] = WorkspaceEntry(
                        rules(node), False, f"tensors of {size} bytes exceed max_call_bytes")
                    continue
                why_not = self._why_not_run(node.op, size)
                if why_not:
                    self._entries[key] = WorkspaceEntry(rules(node), False, why_not)
                    continue
                try:
                    call = real_call(g, node.id, self.device)
                    self._trial(call)
                # Any op may reject synthetic inputs in its own way; the rules answer then.
                except Exception as e:
                    self._entries[key] = WorkspaceEntry(rules(node), False, error_line(e))
                    continue
                if batch and held + size > MAX_BATCH_BYTES:
                    self._record(batch)
                    batch, held = [], 0
                batch.append((key, call))
                held += size
            if batch:
                self._record(batch)


class CalibratedCpuWorkspace(CalibratedWorkspace):
    """Workspace of calls measured on this process's CPU (module docstring), cached on disk.

    The spec "cpu" resolves to the one instance per (fingerprint, cache file, size cap) of a
    process: for_this_machine().
    """

    spec = "cpu"

    def __init__(self, machine: CpuMachine, fingerprint: Fingerprint, path: Path,
                 max_call_bytes: int = DEFAULT_MAX_CALL_BYTES) -> None:
        super().__init__(fingerprint, path, max_call_bytes, torch.device("cpu"))
        self.machine = machine
        self.threads = machine.threads
        self.key = ("calibrated", fingerprint, machine, max_call_bytes)

    @classmethod
    def for_this_machine(cls, cache_dir: Path | None = None,
                         max_call_bytes: int = DEFAULT_MAX_CALL_BYTES) -> CalibratedCpuWorkspace:
        """The model of this process's CPU and settings (one instance per cache file)."""
        fingerprint = workspace_fingerprint()
        directory = cache_root() / "workspace" if cache_dir is None else Path(cache_dir)
        return _instance(CpuMachine.current(), fingerprint, directory / fingerprint.file_name(), max_call_bytes)

    def describe(self) -> str:
        """Which model this is, for reports."""
        return (f"cpu workspace calibrated on this machine ({self.fingerprint.device}): "
                f"{self.table_summary()}; the analytic CPU rules answer the others")

    def can_measure(self) -> bool:
        """False while a profile of our own would end the caller's torch.profiler session, or
        while the process runs on other intra-op threads than the machine modelled (it would
        measure another machine): then the rules answer, and no cache keeps their answers."""
        return not torch.autograd.profiler._is_profiler_enabled and torch.get_num_threads() == self.threads

    def _record(self, batch: list[tuple[str, Callable[[], Any]]]) -> None:
        # each call has just run once (the trial in _measure): that was its warm-up
        for (key, _), nbytes in zip(batch, measure_calls([c for _, c in batch], warm_up=False), strict=True):
            self._entries[key] = WorkspaceEntry(nbytes)


@functools.cache
def _instance(machine: CpuMachine, fingerprint: Fingerprint, path: Path,
              max_call_bytes: int) -> CalibratedCpuWorkspace:
    return CalibratedCpuWorkspace(machine, fingerprint, path, max_call_bytes)


@contextlib.contextmanager
def quiet(device: torch.device) -> Iterator[None]:
    """No autograd (as generated programs run), no autocast (a caller's region would add casts),
    and a forked RNG state on `device` (random ops measured do not move the caller's RNG)."""
    forked = torch.random.fork_rng(devices=[device]) if device.type == "cuda" else torch.random.fork_rng(devices=[])
    with forked, torch.no_grad(), torch.autocast(device.type, enabled=False):   # no casts counted as scratch
        yield
