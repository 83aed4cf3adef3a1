"""peakcut.units: sizes and durations in the unit that fits, three significant digits."""

from __future__ import annotations

import pytest

from peakcut.units import format_bytes, format_seconds


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"),
    (1, "1 B"),
    (512, "512 B"),
    (1023, "1023 B"),
    (1023.6, "1.00 KiB"),          # rounds up to 1024 B: the next unit
    (1024, "1.00 KiB"),
    (1536, "1.50 KiB"),
    (10 * 1024, "10.0 KiB"),
    (148_884, "145 KiB"),
    (2**20 - 1, "1.00 MiB"),       # 1023.999 KiB rounds to 1024: shown as 1.00 MiB
    (int(12.3 * 2**20), "12.3 MiB"),
    (512 * 2**20, "512 MiB"),
    (2**30, "1.00 GiB"),
    (int(80.5 * 2**30), "80.5 GiB"),
    (3 * 2**40, "3.00 TiB"),
    (2048 * 2**40, "2048 TiB"),    # past TiB the digits grow
    (-1536, "-1.50 KiB"),
    (float("inf"), "inf B"),
])
def test_bytes_in_the_unit_that_fits(n: float, text: str) -> None:
    assert format_bytes(n) == text


@pytest.mark.parametrize(("s", "text"), [
    (0, "0 s"),
    (5e-10, "0.50 ns"),
    (1.5e-6, "1.50 µs"),
    (512e-6, "512 µs"),
    (0.0009996, "1.00 ms"),        # rounds up to 1000 µs: the next unit
    (0.0123, "12.3 ms"),
    (0.25, "250 ms"),
    (2.5, "2.50 s"),
    (61.04, "61.0 s"),
    (1500.4, "1500 s"),
    (-0.002, "-2.00 ms"),
])
def test_seconds_in_the_unit_that_fits(s: float, text: str) -> None:
    assert format_seconds(s) == text
