"""peakcut installs like a package: the wheel builds, its core requires no framework, and
installed where only torch and the core's dependencies are, `import peakcut` and
`peakcut --help` work while a framework used without its extra raises an ImportError that
names the extra.

The empty environment is a virtualenv without pip whose site-packages holds symbolic links
to the core's installed distributions (torch and the dependencies the wheel's metadata
names, and theirs), nothing else: nothing is downloaded, and the frameworks the test
environment has (transformers, peft, accelerate, lightning) cannot be imported there. The
wheel goes in with this environment's pip (`pip --python`), without dependencies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("transformers", "peft", "accelerate", "lightning")
EXTRAS = ("transformers", "peft", "accelerate", "lightning", "workloads", "dev")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the project (the work tree stays as it is)."""
    tmp = tmp_path_factory.mktemp("wheel")
    project = tmp / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(project), "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(tmp / "dist")], check=True, timeout=300)
    (built,) = (tmp / "dist").glob("peakcut-*.whl")
    return built


def _metadata(wheel: Path) -> list[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as zf:
        (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        text = zf.read(name).decode()
    head = text.split("\n\n", 1)[0]             # the headers; the README follows
    return [(k, v.strip()) for k, _, v in (line.partition(":") for line in head.splitlines()) if v]


def _core_requirements(wheel: Path) -> list[Requirement]:
    reqs = [Requirement(v) for k, v in _metadata(wheel) if k == "Requires-Dist"]
    return [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]


def test_the_core_requires_no_framework_and_the_extras_exist(wheel: Path) -> None:
    fields = _metadata(wheel)
    core = {r.name.lower() for r in _core_requirements(wheel)}
    assert "torch" in core and not core & set(FRAMEWORKS), core
    assert {v for k, v in fields if k == "Provides-Extra"} >= set(EXTRAS)
    by_extra: dict[str, set[str]] = {}
    for k, v in fields:
        if k == "Requires-Dist" and (m := re.search(r'extra == "([^"]+)"', v)):
            by_extra.setdefault(m.group(1), set()).add(Requirement(v).name.lower())
    for framework in FRAMEWORKS:
        assert framework in by_extra[framework] and framework in by_extra["dev"], framework
    with zipfile.ZipFile(wheel) as zf:
        entry_points = next(zf.read(n).decode() for n in zf.namelist() if n.endswith("entry_points.txt"))
    assert "peakcut = peakcut.cli:main" in entry_points


def _distributions(requirements: list[Requirement]) -> list[metadata.Distribution]:
    """The installed distributions `requirements` need, with their own dependencies (markers
    evaluated here, no extras)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(requirements)
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        dist = metadata.distribution(req.name)
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        todo.extend(Requirement(r) for r in dist.requires or [])
    return list(seen.values())


def _core_only_environment(where: Path, wheel: Path) -> Path:
    """A virtualenv at `where` in which only the core's distributions are importable; its python."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    for dist in _distributions(_core_requirements(wheel)):
        top = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for name in top - {"__pycache__"}:
            source = Path(str(dist.locate_file(name)))
            if source.exists() and not name.endswith(".pth") and not (site / name).exists():
                (site / name).symlink_to(source)
    return python


def test_the_wheel_installs_into_an_environment_without_the_frameworks(wheel: Path, tmp_path: Path) -> None:
    python = _core_only_environment(tmp_path / "env", wheel)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet",
                    "--disable-pip-version-check", str(wheel)], check=True, env=env, timeout=300)
    with zipfile.ZipFile(wheel) as zf:
        integrations = sorted(Path(n).stem for n in zf.namelist()
                              if re.fullmatch(r"peakcut/integrations/[a-z_]+\.py", n) and not n.endswith("__.py"))
    probe = subprocess.run([str(python), "-c", _PROBE, *integrations], check=True, capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=300)
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["file"].startswith(str(tmp_path / "env")), found["file"]     # the installed copy
    assert found["importable"] == [], f"frameworks importable without their extras: {found['importable']}"
    assert "peakcut[workloads]" in found["workload"], found["workload"]
    for name in integrations:
        error = found["integrations"][name]
        if error is None:           # imports its framework only when used
            assert found["loaded"][name] == [], f"peakcut.integrations.{name} imported {found['loaded'][name]}"
        else:
            extra = name if name in EXTRAS else ""
            assert f"peakcut[{extra}" in error, f"peakcut.integrations.{name}: {error}"
    help_text = subprocess.run([str(tmp_path / "env" / "bin" / "peakcut"), "--help"], check=True,
                               capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert "MODULE:FACTORY" in help_text.stdout


_PROBE = """
import importlib, importlib.util, json, sys
import peakcut
import peakcut.integrations
frameworks = ("transformers", "peft", "accelerate", "lightning")
found = {"file": peakcut.__file__, "integrations": {}, "loaded": {},
         "importable": [m for m in frameworks if importlib.util.find_spec(m) is not None]}
from peakcut.workloads import get_workload
try:
    get_workload("bert-base").build("tiny")
    found["workload"] = "built without transformers"
except ImportError as e:
    found["workload"] = str(e)
for name in sys.argv[1:]:
    try:
        importlib.import_module("peakcut.integrations." + name)
        found["integrations"][name] = None
    except ImportError as e:
        found["integrations"][name] = str(e)
    found["loaded"][name] = [m for m in frameworks if m in sys.modules]
print(json.dumps(found))
"""
