"""What the search optimizes: the two modes of MAGIS §6.2, their limits and BetterThan.

- memory mode (memory_limit M): least latency among plans with peak <= M; while
  no plan meets M, the lower peak is better;
- latency mode (latency_limit L): least peak among plans with latency <= L; while
  no plan meets L, the lower latency is better.

A state's key is (0, objective) when it meets the limit, else (1, violated
measure): smaller is better, so the heap of the search orders by it. The
relaxation δ (MAGIS: 1.1) keeps states within δ of the best in the queue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import overload

RELAXATION = 1.1

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class LimitError(ValueError):
    """A memory or latency limit that cannot be understood (the message names the argument)."""


@overload
def parse_memory_limit(value: None, eager_peak: int) -> None: ...
@overload
def parse_memory_limit(value: float | int | str, eager_peak: int) -> int: ...
def parse_memory_limit(value: float | int | str | None, eager_peak: int) -> int | None:
    """Bytes from 0.4 (fraction of the eager peak), "40%", "12GB", "12GiB" or an int of bytes."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise LimitError(f"memory_limit: expected a fraction, a size or bytes, got {value!r}")
    if isinstance(value, float):
        if not 0 < value <= 1:
            raise LimitError(f"memory_limit={value}: a float is a fraction of the eager peak, in (0, 1]")
        return int(value * eager_peak)
    if isinstance(value, int):
        if value <= 0:
            raise LimitError(f"memory_limit={value}: bytes must be positive")
        return value
    text = str(value).strip().lower().replace(" ", "")
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise LimitError(f"memory_limit={value!r}: not a percentage") from None
        return parse_memory_limit(pct / 100, eager_peak)
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)([a-z]*)", text)
    if m is None or m.group(2) not in _UNITS:
        raise LimitError(f"memory_limit={value!r}: expected e.g. 0.4, '40%', '12GB', '12GiB' or bytes")
    size = float(m.group(1)) * _UNITS[m.group(2)]
    if m.group(2) == "" and "." in m.group(1):
        return parse_memory_limit(float(m.group(1)), eager_peak)
    return parse_memory_limit(int(size), eager_peak)


@overload
def parse_latency_limit(value: None, eager_latency: float) -> None: ...
@overload
def parse_latency_limit(value: float | str, eager_latency: float) -> float: ...
def parse_latency_limit(value: float | str | None, eager_latency: float) -> float | None:
    """Seconds from a ratio to the eager latency (1.1, "1.1", "110%", "+10%")."""
    if value is None:
        return None
    if isinstance(value, str):
        text = value.strip()
        try:
            if text.startswith("+") and text.endswith("%"):
                value = 1 + float(text[1:-1]) / 100
            elif text.endswith("%"):
                value = float(text[:-1]) / 100
            else:
                value = float(text)
        except ValueError:
            raise LimitError(f"latency_limit={text!r}: expected a ratio such as 1.1, '110%' or '+10%'") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        raise LimitError(f"latency_limit={value!r}: a ratio to the eager latency, at least 1.0")
    return float(value) * eager_latency


@dataclass(frozen=True)
class Objective:
    """The mode, its limit (bytes or seconds) and the relaxation δ."""

    mode: str                  # "memory" (limit on peak bytes) or "latency" (limit on seconds)
    limit: float
    relaxation: float = RELAXATION

    def __post_init__(self) -> None:
        if self.mode not in ("memory", "latency"):
            raise LimitError(f"mode must be 'memory' or 'latency', got {self.mode!r}")
        if self.relaxation < 1:
            raise LimitError(f"relaxation must be >= 1, got {self.relaxation}")

    def feasible(self, peak: int, latency: float) -> bool:
        return (peak if self.mode == "memory" else latency) <= self.limit

    def key(self, peak: int, latency: float) -> tuple[int, float, float]:
        """Smaller is better (BetterThan); the third entry breaks ties by the other measure."""
        if self.mode == "memory":
            return (0, latency, peak) if peak <= self.limit else (1, peak, latency)
        return (0, peak, latency) if latency <= self.limit else (1, latency, peak)

    def better(self, a: tuple[int, float, float], b: tuple[int, float, float]) -> bool:
        return a < b

    def approaches(self, a: tuple[int, float, float], best: tuple[int, float, float]) -> bool:
        """a misses the limit that the best meets, but beats the best on the objective's measure
        (memory mode: a lower latency; latency mode: a lower peak): moves that bring it under
        the limit may cost less than the best's."""
        return a[0] == 1 and best[0] == 0 and a[2] < best[1]

    def within_relaxation(self, a: tuple[int, float, float], best: tuple[int, float, float]) -> bool:
        """a is worth expanding: as feasible as the best and within δ of it, or more feasible."""
        if a[0] != best[0]:
            return a[0] < best[0]
        return a[1] <= self.relaxation * best[1]
