"""Sizes and durations for people: the unit that fits, three significant digits.

    format_bytes(512)          -> "512 B"
    format_bytes(1536)         -> "1.50 KiB"
    format_bytes(12.3 * 2**20) -> "12.3 MiB"
    format_bytes(3 * 2**30)    -> "3.00 GiB"
    format_seconds(0.000512)   -> "512 µs"
    format_seconds(0.0123)     -> "12.3 ms"
    format_seconds(2.5)        -> "2.50 s"

Bytes use binary units (B, KiB, MiB, GiB, TiB: powers of 1024); below 1 KiB they are
whole bytes. Above, the value is shown with three significant digits: two decimals
below 10, one below 100, none from 100 up ("1.50", "12.3", "512"). A value that rounds
up to 1024 of a unit is shown in the next one ("1.00 MiB", not "1024 KiB"); past TiB
the digits grow ("2048 TiB"). Durations likewise in ns, µs, ms and s (from 1000 s up,
whole seconds). Negative values keep their sign ("-1.50 KiB"); NaN and infinities are printed
as Python does ("inf B").
"""

from __future__ import annotations

import math

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
SECOND_UNITS = (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0))


def _digits(v: float) -> str:
    """v >= 0 with three significant digits (at least the whole part)."""
    if round(v, 2) < 10:
        return f"{v:.2f}"
    if round(v, 1) < 100:
        return f"{v:.1f}"
    return f"{v:.0f}"


def format_bytes(n: int | float) -> str:
    """`n` bytes in B, KiB, MiB, GiB or TiB (see module doc)."""
    if not math.isfinite(n):
        return f"{n} B"
    sign, n = ("-" if n < 0 else ""), abs(n)
    if round(n) < 1024:
        return f"{sign}{round(n)} B"
    k = 1
    while k < len(BYTE_UNITS) - 1 and round(n / 1024**k) >= 1024:
        k += 1
    v = n / 1024**k
    return f"{sign}{_digits(v)} {BYTE_UNITS[k]}"


def format_seconds(s: float) -> str:
    """`s` seconds in ns, µs, ms or s (see module doc)."""
    if not math.isfinite(s):
        return f"{s} s"
    if s == 0:
        return "0 s"
    sign, s = ("-" if s < 0 else ""), abs(s)
    for i, (unit, scale) in enumerate(SECOND_UNITS):
        last = i == len(SECOND_UNITS) - 1
        if last or round(s / scale) < 1000:
            return f"{sign}{_digits(s / scale)} {unit}"
    raise AssertionError("unreachable")
