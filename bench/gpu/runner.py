"""The run: one process per workload, under one deadline, results rewritten after each.

Before each workload the time plan is made again from the time left (bench.gpu.timeplan);
a workload with nothing admitted is a row that says why. Its process was started while the
previous workload ran (imports only: nothing touches the device before it is told to go), is
sent its slot on stdin, and is stopped `grace` seconds (GRACE_S) after its slot or at the run's deadline,
whichever comes first. Its row is the last "ROW <json>" line it printed (bench.gpu.child),
with the error that ended it, if any: a crash, a hang or an out-of-memory error is that
workload's row, not the end of the run. Files under --out: results.json (every figure),
results.md (the tables, bench.gpu.tables) and log.txt (every process's output but its ROW
lines), each rewritten or appended to after each workload; each process's whole output in
<logs>/<workload>.txt (default <out>/logs).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bench.gpu.tables import markdown
from bench.gpu.timeplan import GRACE_S, Effort, Slot, plan_run

Command = Callable[[str], list[str]]


@dataclass
class Settings:
    """What a run is asked for: jobs ((workload, limit)), size, batch, effort, deadline, out;
    `grace` the seconds a workload's process may run beyond its slot."""

    jobs: list[tuple[str, str]]
    size: str = "paper"
    batch: int | None = None
    effort: Effort = field(default_factory=Effort)
    deadline: float = 540.0
    out: Path = Path("gpu-results")
    grace: float = GRACE_S          # beyond its slot before a workload's process is stopped
    logs: Path | None = None        # each process's output (default: out / "logs")


def child_command(settings: Settings) -> Command:
    """The command line of one workload's process."""
    def command(name: str) -> list[str]:
        cmd = [sys.executable, "-m", "bench.gpu", "--child", name, "--size", settings.size]
        return cmd + (["--batch", str(settings.batch)] if settings.batch is not None else [])
    return command


@dataclass
class _Started:
    name: str
    proc: subprocess.Popen[str]
    log: TextIO
    path: Path


def _start(name: str, command: Command, logs: Path) -> _Started:
    path = logs / f"{name}.txt"
    log = path.open("w")
    proc = subprocess.Popen(command(name), stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, text=True)
    return _Started(name, proc, log, path)


def _stop(started: _Started) -> None:
    """A started process that is not needed: told to leave, then stopped."""
    try:
        if started.proc.stdin is not None:
            started.proc.stdin.close()
        started.proc.wait(timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        started.proc.kill()
        started.proc.wait()
    started.log.close()


def _row(started: _Started, slot: Slot, timeout: float) -> dict[str, Any]:
    """Send the slot, wait for the process, and read its row (module doc)."""
    t0 = time.monotonic()
    note = ""
    try:
        if started.proc.stdin is not None:
            started.proc.stdin.write(json.dumps(slot.as_dict()) + "\n")
            started.proc.stdin.close()
    except OSError:                 # the process ended before it was told to go: its exit says why
        pass
    try:
        code = started.proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        started.proc.kill()
        started.proc.wait()
        code = None
        note = f"stopped after {time.monotonic() - t0:.0f} s: its slot ({slot.seconds:.0f} s) and grace ran out"
    started.log.close()
    text = started.path.read_text(errors="replace")
    row = _last_row(text) or {"workload": started.name, "slot": slot.as_dict()}
    if code not in (0, None) and not note:
        tail = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("ROW ")]
        note = f"exit {code}: {tail[-1][:400] if tail else 'no output'}"
    if note:
        row["error"] = note
    row["wall_s"] = round(time.monotonic() - t0, 1)
    return row


def _last_row(text: str) -> dict[str, Any] | None:
    """The last whole "ROW <json>" line of a process's output (one cut off by a kill is skipped)."""
    for line in reversed(text.splitlines()):
        if line.startswith("ROW "):
            try:
                found = json.loads(line[4:])
            except json.JSONDecodeError:
                continue
            if isinstance(found, dict):
                return found
    return None


def run(settings: Settings, command: Command | None = None) -> dict[str, Any]:
    """Every workload of settings.jobs in its own process (module doc); the results."""
    command = command or child_command(settings)
    out = settings.out
    logs = settings.logs or out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "log.txt").write_text("")
    t_start = time.monotonic()
    end = t_start + settings.deadline
    first = plan_run(settings.jobs, settings.deadline, settings.effort)
    names = [s.workload for s in first]
    results: dict[str, Any] = {"size": settings.size, "deadline_s": settings.deadline,
                               "jobs": [f"{w}:{lim}" for w, lim in settings.jobs],
                               "time_plan": [s.as_dict() for s in first], "rows": []}
    started: _Started | None = None
    for i, name in enumerate(names):
        jobs = [j for j in settings.jobs if j[0] in names[i:]]
        slot = next(s for s in plan_run(jobs, end - time.monotonic(), settings.effort) if s.workload == name)
        if started is not None and (started.name != name or not slot.limits):
            _stop(started)
            started = None
        if not slot.limits:
            results["rows"].append({"workload": name, "size": settings.size, "slot": slot.as_dict(),
                                    "skipped": slot.skipped, "error": "not run: " + "; ".join(slot.skipped)})
            _write(results, out, t_start)
            continue
        current = started if started is not None else _start(name, command, logs)
        later = next((n for n in names[i + 1:]), None)
        started = _start(later, command, logs) if later is not None else None
        print(f"== {name}: limits {', '.join(slot.limits)}, optimize {slot.budget_s:.0f} s each, "
              f"slot {slot.seconds:.0f} s, {end - time.monotonic():.0f} s left", flush=True)
        row = _row(current, slot, min(slot.seconds + settings.grace, end - time.monotonic()))
        results["rows"].append(row)
        text = "\n".join(ln for ln in current.path.read_text(errors="replace").splitlines() if not ln.startswith("ROW "))
        with (out / "log.txt").open("a") as log:
            log.write(f"==== {name}\n{text}\n")
        print(f"== {name}: {row.get('error', 'done')} ({row['wall_s']} s)", flush=True)
        _write(results, out, t_start)
    if started is not None:
        _stop(started)
    _write(results, out, t_start)
    return results


def _write(results: dict[str, Any], out: Path, t_start: float) -> None:
    results["device"] = next((r["device"] for r in results["rows"] if r.get("device")), None)
    results["elapsed_s"] = round(time.monotonic() - t_start, 1)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "results.md").write_text(markdown(results))


def jobs_of(workloads: Sequence[str], limits: Sequence[str]) -> list[tuple[str, str]]:
    """(workload, limit) for NAME (every limit) or NAME:LIMIT (that one)."""
    return [(w.partition(":")[0], lim) for w in workloads for lim in ([w.partition(":")[2]] if ":" in w else limits)]
