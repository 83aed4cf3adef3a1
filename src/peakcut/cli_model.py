"""The training step a `peakcut` command works on: a built-in workload, or a user's own model
from a `module:factory` in the current directory.

    peakcut optimize bert-base --size tiny          # a workload (peakcut workloads)
    peakcut optimize my_model:make                  # make() of ./my_model.py
    peakcut profile models/mine.py:make             # a file by its path

The current directory comes first on the import path, as with `python -m`, so a module there
is found without PYTHONPATH. FACTORY_HELP says what the factory may return.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

FACTORY_HELP = """\
WORKLOAD is a built-in workload (peakcut workloads) or MODULE:FACTORY, your own model:
MODULE is a module found from the current directory (my_model, pkg.models) or a file
(models/mine.py), FACTORY a function of no arguments returning one of
  (model, batch, loss_fn)
  (model, batch, loss_fn, optimizer)
  {"model": ..., "batch": ..., "loss_fn": ..., "optimizer": ...}   (optimizer optional)
where loss_fn(model, batch) returns the scalar loss and optimizer is your torch.optim
SGD / Adam / AdamW over the model's parameters (any param groups) or "sgd" / "adam" /
"adamw". Without one, --optimizer picks it (default adamw). --max-grad-norm clips the
gradients by global norm before the update, as torch.nn.utils.clip_grad_norm_."""

_DEFAULT_OPTIMIZER = "adamw"


def grad_norm(text: str) -> float:
    """--max-grad-norm's value: a number > 0 (argparse's type)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0")
    return value


@dataclasses.dataclass(frozen=True)
class StepSource:
    """What a command captures: model, batch and loss_fn(model, batch), the optimizer as
    peakcut.capture takes it, and a description for titles. size and batch_size: the
    workload's, None for a user's model."""

    model: torch.nn.Module
    batch: Any
    loss_fn: Any
    optimizer: Any
    description: str
    size: str | None = None
    batch_size: int | None = None

    @property
    def optimizer_name(self) -> str:
        """The optimizer for people: its name, or its class."""
        opt = self.optimizer
        return opt if isinstance(opt, str) else type(opt).__name__


def load_step(workload: str, size: str | None, optimizer: str | None, batch: int | None = None) -> StepSource:
    """The step of `workload` (a name from peakcut.workloads, or module:factory, see
    FACTORY_HELP); SystemExit with a message naming the argument on bad input. `size` and
    `batch` apply to built-in workloads only; `optimizer` is the --optimizer given (None: not given)."""
    from peakcut.workloads import ALL_WORKLOAD_NAMES, GNN_WORKLOAD_NAMES, get_workload

    if workload in ALL_WORKLOAD_NAMES or workload in GNN_WORKLOAD_NAMES:
        inst = get_workload(workload).build(size or "paper", batch_size=batch)
        return StepSource(inst.model, inst.batch, inst.loss_fn, optimizer or _DEFAULT_OPTIMIZER,
                          inst.description, inst.size, inst.batch_size)
    if ":" not in workload:
        raise SystemExit(f"workload {workload!r}: expected a workload name ({', '.join(ALL_WORKLOAD_NAMES)}) "
                         "or MODULE:FACTORY")
    for flag, value in (("--size", size), ("--batch", batch)):
        if value is not None:
            raise SystemExit(f"{flag}: applies to built-in workloads only, not to {workload!r} "
                             "(your factory builds the model and batch)")
    made = _call_factory(workload)
    if made.optimizer is not None and optimizer is not None:
        raise SystemExit(f"--optimizer {optimizer}: {workload} returns its own optimizer "
                         f"({made.optimizer_name}); drop one of them")
    return made if made.optimizer is not None else _with_optimizer(made, optimizer or _DEFAULT_OPTIMIZER)


def _with_optimizer(made: StepSource, optimizer: str) -> StepSource:
    return dataclasses.replace(made, optimizer=optimizer)


def _call_factory(spec: str) -> StepSource:
    """Import MODULE, call FACTORY() and check what it returned."""
    module_name, _, attr = spec.rpartition(":")
    module = _import(spec, module_name)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise SystemExit(f"workload {spec!r}: {module_name} has no function {attr!r}")
    made = factory()
    if isinstance(made, Mapping):
        unknown = set(made) - {"model", "batch", "loss_fn", "optimizer"}
        missing = {"model", "batch", "loss_fn"} - set(made)
        if unknown or missing:
            raise SystemExit(f"workload {spec!r}: {attr}() returned a dict with "
                             f"{'unknown keys ' + str(sorted(unknown)) if unknown else ''}"
                             f"{' and ' if unknown and missing else ''}"
                             f"{'no ' + str(sorted(missing)) if missing else ''}; see peakcut optimize --help")
        model, batch, loss_fn, optimizer = made["model"], made["batch"], made["loss_fn"], made.get("optimizer")
    elif isinstance(made, tuple) and len(made) in (3, 4):
        model, batch, loss_fn, optimizer = (*made, None) if len(made) == 3 else made
    else:
        raise SystemExit(f"workload {spec!r}: {attr}() returned {type(made).__name__}; expected (model, batch, "
                         "loss_fn), (model, batch, loss_fn, optimizer) or a dict of them (peakcut optimize --help)")
    if not isinstance(model, torch.nn.Module):
        raise SystemExit(f"workload {spec!r}: the model {attr}() returned is a {type(model).__name__}, "
                         "not a torch.nn.Module")
    if not callable(loss_fn):
        raise SystemExit(f"workload {spec!r}: loss_fn must be a function loss_fn(model, batch) -> loss")
    return StepSource(model, batch, loss_fn, optimizer, spec)


def _import(spec: str, module_name: str) -> ModuleType:
    """MODULE: a file (ends in .py) or a module found from the current directory."""
    try:
        if module_name.endswith(".py"):
            return _import_file(Path(module_name))
        here = os.getcwd()
        if here not in sys.path:
            sys.path.insert(0, here)
        return importlib.import_module(module_name)
    except (ImportError, OSError) as e:
        raise SystemExit(f"workload {spec!r}: cannot import {module_name} from {os.getcwd()}: {e}") from None


def _import_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise ImportError(f"no file {path}")
    folder = str(path.resolve().parent)
    if folder not in sys.path:            # its own imports of modules beside it
        sys.path.insert(0, folder)
    loader_spec = importlib.util.spec_from_file_location(path.stem, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ImportError(f"{path} is not a Python module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[path.stem] = module       # so that pickling and dataclasses find it
    loader_spec.loader.exec_module(module)
    return module
