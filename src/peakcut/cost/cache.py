"""The on-disk cache of measured latencies: one JSON file per fingerprint.

Location: ``$PEAKCUT_CACHE/costs/`` (default ``~/.cache/peakcut/costs/``), file
``<device kind>-<hash of the fingerprint>.json``. Format::

    {
      "schema": 1,
      "fingerprint": {"device": "cpu: AMD EPYC (2 threads, AVX512)", "torch": "2.13.0+cpu",
                      "schema": 1},
      "line_overhead_seconds": 5e-08,            # or null: not calibrated yet
      "entries": {
        "aten.mm.default(T[4,64;64,1;float32], T[64,64;1,64;float32])":
            {"seconds": 5.1e-06, "estimated": false, "reason": "",
             "work": ["aten.mm.default:float32", 32768, 34816, 2.2e-06]},
        ...
      }
    }

An entry is ``estimated`` when the call could not be timed standalone and its seconds come
from the analytic profile; ``reason`` says why. ``work`` (optional: files without it still
load) is what the fitted prices of calls not measured yet read of a measured one
(peakcut.cost.fitted.Work: family, FLOPs, bytes, the analytic estimate). On load, a file that is not valid JSON, has
wrong types, another schema or another fingerprint is reported with warnings.warn (naming the
file and the reason) and rebuilt from scratch: it is never trusted silently. Writes go to a
temporary file in the same directory, then os.replace: readers see the old or the new file.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from peakcut.cost.fingerprint import Fingerprint
from peakcut.cost.fitted import Work

SCHEMA_VERSION = 1
T = TypeVar("T")


def cache_root() -> Path:
    """$PEAKCUT_CACHE, or ~/.cache/peakcut: where every on-disk cache of peakcut lives."""
    return Path(os.environ.get("PEAKCUT_CACHE") or Path.home() / ".cache" / "peakcut")


def default_cache_dir() -> Path:
    """$PEAKCUT_CACHE/costs, or ~/.cache/peakcut/costs."""
    return cache_root() / "costs"


@dataclass(frozen=True)
class CostEntry:
    """Seconds of one call key; estimated entries come from the analytic fallback."""

    seconds: float
    estimated: bool = False
    reason: str = ""
    work: Work | None = None       # what a fit reads of the call (peakcut.cost.fitted)

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"seconds": self.seconds, "estimated": self.estimated, "reason": self.reason}
        if self.work is not None:
            found["work"] = self.work.as_list()
        return found


@dataclass
class CostTable:
    """What one cache file holds: per-key entries and the calibrated per-line overhead."""

    entries: dict[str, CostEntry] = field(default_factory=dict)
    line_overhead_seconds: float | None = None


class CacheFormatError(ValueError):
    """A cache file's content is not what this schema writes."""


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CacheFormatError(f"{what} is {type(value).__name__}, expected a number")
    if not math.isfinite(value) or value < 0:
        raise CacheFormatError(f"{what} is {value}, expected a finite number >= 0")
    return float(value)


def _entry(key: str, value: Any) -> CostEntry:
    if not isinstance(value, dict):
        raise CacheFormatError(f"entry {key!r} is {type(value).__name__}, expected an object")
    estimated, reason = value.get("estimated"), value.get("reason")
    if not isinstance(estimated, bool) or not isinstance(reason, str):
        raise CacheFormatError(f"entry {key!r} has a non-bool 'estimated' or non-str 'reason'")
    return CostEntry(_seconds(value.get("seconds"), f"entry {key!r} seconds"), estimated, reason,
                     _work(key, value.get("work")))


def _work(key: str, value: Any) -> Work | None:
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 4 and isinstance(value[0], str)):
        raise CacheFormatError(f"entry {key!r} work is not [family, flops, bytes, analytic]")
    return Work(value[0], *(_seconds(v, f"entry {key!r} work") for v in value[1:]))


def checked_entries(data: Any, fingerprint: Fingerprint, schema: int) -> dict[Any, Any]:
    """The 'entries' object of a cache file's decoded JSON `data`, after checking its top
    level, its schema and that its fingerprint is `fingerprint`; CacheFormatError says what
    is wrong otherwise."""
    if not isinstance(data, dict):
        raise CacheFormatError(f"top level is {type(data).__name__}, expected an object")
    if data.get("schema") != schema:
        raise CacheFormatError(f"schema {data.get('schema')!r}, expected {schema}")
    if data.get("fingerprint") != fingerprint.as_dict():
        raise CacheFormatError(
            f"fingerprint {data.get('fingerprint')!r} is not this machine's "
            f"{fingerprint.as_dict()!r}"
        )
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise CacheFormatError(f"'entries' is {type(entries).__name__}, expected an object")
    return entries


def parse_table(data: Any, fingerprint: Fingerprint) -> CostTable:
    """The table in decoded JSON `data`; CacheFormatError says what is wrong with it."""
    entries = checked_entries(data, fingerprint, SCHEMA_VERSION)
    overhead = data.get("line_overhead_seconds")
    if overhead is not None:
        overhead = _seconds(overhead, "line_overhead_seconds")
    return CostTable({str(k): _entry(str(k), v) for k, v in entries.items()}, overhead)


def load_json(path: Path, parse: Callable[[Any], T], empty: Callable[[], T], what: str) -> T:
    """parse(the JSON in `path`); empty() when there is no file, or -- with a warning naming
    the file and the reason -- when it cannot be read, is not JSON or parse raises
    CacheFormatError. `what` names the cache in the warning ("cost cache")."""
    def rebuild(reason: str) -> T:
        warnings.warn(f"peakcut {what} {path}: {reason}; rebuilding it", RuntimeWarning, stacklevel=4)
        return empty()

    try:
        text = path.read_text()
    except FileNotFoundError:
        return empty()
    except OSError as e:
        return rebuild(f"cannot be read ({e})")
    try:
        return parse(json.loads(text))
    except json.JSONDecodeError as e:
        return rebuild(f"is not valid JSON ({e})")
    except CacheFormatError as e:
        return rebuild(str(e))


def save_json(path: Path, data: Any) -> None:
    """Write `data` as JSON atomically (temporary file in the same directory + os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CostCache:
    """The cache file of one fingerprint in `directory`."""

    def __init__(self, fingerprint: Fingerprint, directory: Path | None = None) -> None:
        self.fingerprint = fingerprint
        self.directory = Path(directory) if directory is not None else default_cache_dir()
        self.path = self.directory / fingerprint.file_name()

    def load(self) -> CostTable:
        """The stored table; empty when there is no file, or (with a warning) a bad one."""
        return load_json(self.path, lambda data: parse_table(data, self.fingerprint), CostTable, "cost cache")

    def save(self, table: CostTable) -> None:
        """Write `table` atomically (temporary file + os.replace)."""
        save_json(self.path, {
            "schema": SCHEMA_VERSION,
            "fingerprint": self.fingerprint.as_dict(),
            "line_overhead_seconds": table.line_overhead_seconds,
            "entries": {k: e.as_dict() for k, e in sorted(table.entries.items())},
        })
