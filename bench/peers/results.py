"""One table cell: what a tool did on a workload at a size (measured or simulated), or why it failed."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Cell:
    """Result of one tool on one workload.

    Tiny (measured on CPU): peak_bytes = allocator peak of one step + baseline_bytes
    (parameters, buffers, optimizer state and batch held by the caller); times = step
    seconds after warm-up; peaks = the peak of each profiled repeat (determinism check).
    Paper (simulated): peak_bytes from peakcut.memory.simulate (whole step, caller-held included);
    latency = simulated step seconds per device profile; profile_peak = the peak per profile
    where the plan itself depends on the profile (ZeRO-Offload's placement), else empty.
    """

    workload: str
    tool: str
    curve: str
    size: str
    peak_bytes: int | None = None
    baseline_bytes: int = 0
    peaks: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    latency: dict[str, float] = field(default_factory=dict)
    profile_peak: dict[str, int] = field(default_factory=dict)
    setup_seconds: float = 0.0      # compile / capture time (excluded from step time)
    nodes: int = 0
    note: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.peak_bytes is not None

    def peak(self, profile: str = "") -> int:
        """Peak bytes (on `profile` where the plan depends on it)."""
        if self.peak_bytes is None:
            raise ValueError(f"{self.workload} {self.tool}: no peak ({self.error})")
        return self.profile_peak.get(profile, self.peak_bytes)

    def seconds(self, profile: str = "") -> float:
        """Median measured step time (tiny) or simulated latency on `profile` (paper)."""
        return self.latency[profile] if profile else statistics.median(self.times)


def fail_reason(e: BaseException, limit: int = 110) -> str:
    """First line of an exception (the innermost of a compiler-wrapped one), shortened for a cell."""
    inner = getattr(e, "inner_exception", None)  # torch._dynamo BackendCompilerFailed
    if isinstance(inner, BaseException):
        e = inner
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    text = text.replace("|", "/")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def save(cells: list[Cell], path: Path, meta: dict) -> None:
    """Cells plus the run's meta (environment line, run seconds, workload and tool order)."""
    path.write_text(json.dumps({"meta": meta, "cells": [asdict(c) for c in cells]}, indent=1))


def load(path: Path) -> tuple[list[Cell], dict]:
    data = json.loads(path.read_text())
    return [Cell(**d) for d in data["cells"]], data["meta"]


def merge(old: list[Cell], old_meta: dict, new: list[Cell], new_meta: dict) -> tuple[list[Cell], dict]:
    """Old cells with those of a later (partial) run put in their place; meta notes both runs."""
    fresh = {(c.workload, c.tool): c for c in new}
    cells = [fresh.pop((c.workload, c.tool), c) for c in old] + list(fresh.values())
    meta = dict(old_meta)
    meta["env"] = f"{old_meta['env']} Cells re-run later: {new_meta['env']}"
    meta["seconds"] = old_meta["seconds"] + new_meta["seconds"]
    meta["workloads"] = old_meta["workloads"] + [w for w in new_meta["workloads"] if w not in old_meta["workloads"]]
    meta["tools"] = old_meta["tools"] + [t for t in new_meta["tools"] if t not in old_meta["tools"]]
    return cells, meta
