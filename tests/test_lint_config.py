"""The mypy configuration in pyproject.toml keeps its promise: strict where it says so.

mypy applies `strict = true` written in an override section to every module, so the strict
packages list the per-module flags --strict turns on. This test asks the installed mypy which
flags those are, so a mypy release that adds one to --strict shows up here.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
STRICT_PACKAGES = ("peakcut.ir", "peakcut.memory", "peakcut.schedule")


def _mypy_config() -> dict[str, Any]:
    with PYPROJECT.open("rb") as f:
        config: dict[str, Any] = tomllib.load(f)["tool"]["mypy"]
    return config


def _strict_flags() -> dict[str, bool]:
    """Per-module flag -> value, for the flags --strict changes (asked of the installed mypy)."""
    main = pytest.importorskip("mypy.main")
    from mypy.options import PER_MODULE_OPTIONS

    no_config = ["--config-file", "", "-c", "pass"]
    _, strict = main.process_options(["--strict", *no_config])
    _, plain = main.process_options(no_config)
    return {k: getattr(strict, k) for k in PER_MODULE_OPTIONS
            if getattr(strict, k) != getattr(plain, k)}


def test_strict_packages_get_every_strict_flag() -> None:
    config = _mypy_config()
    assert "strict" not in config, "global strict would make every module strict"
    flags = _strict_flags()
    assert flags, "mypy --strict changes no per-module flag?"
    for package in STRICT_PACKAGES:
        sections = [o for o in config.get("overrides", [])
                    if package in o["module"] and f"{package}.*" in o["module"]]
        assert len(sections) == 1, f"{package}: one override section naming it and its modules"
        section = sections[0]
        assert "strict" not in section, "strict in an override applies to every module"
        missing = {k: v for k, v in flags.items() if section.get(k) != v}
        assert not missing, f"{package}: the override lacks these --strict flags: {missing}"


def test_no_blanket_ignores() -> None:
    config = _mypy_config()
    assert not config.get("ignore_missing_imports"), "ignore missing imports per library only"
    for section in config.get("overrides", []):
        assert not section.get("ignore_errors"), f"{section['module']}: ignore_errors"
        peakcut_modules = [m for m in section["module"] if m.split(".")[0] == "peakcut"]
        assert not (peakcut_modules and section.get("ignore_missing_imports")), section["module"]
