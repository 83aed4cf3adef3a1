"""An optimized step: run it, read its report and source, save it, load it back.

    plan.step(batch)          # one optimized step on real data (parameters and optimizer state updated in place)
    plan.report               # dict: before/after peak and latency, how each was obtained, what was applied
    plan.source               # the generated program
    plan.save("out/plan"); peakcut.load_plan("out/plan", model)
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from peakcut.capture.trace import CaptureError
from peakcut.codegen.arena_plan import ArenaPlan
from peakcut.codegen.program import Step, StepBindingError
from peakcut.ir.graph import Graph
from peakcut.ir.guards import SpecializationError
from peakcut.ir.serialize import graph_from_json, graph_to_json
from peakcut.runtime.host_allocator import release_freed_host_memory
from peakcut.spec.constants import held
from peakcut.spec.tensor_kinds import batch_problem
from peakcut.units import format_bytes, format_seconds

PLAN_FILES = ("graph.json", "order.json", "report.json", "program.py")


class LimitNotMet(RuntimeError):
    """The limit could not be met within the time budget; `.plan` is the best plan found.
    `.measured`: the verification's figures (report["verification"]) when the candidates
    were run for real, else None."""

    def __init__(self, message: str, plan: Plan, measured: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.plan = plan
        self.measured = measured


@dataclass
class Program:
    """One searched step: the best graph and order, its report, and whether it met the limit."""

    graph: Graph
    order: list[int]
    report: dict[str, Any]
    feasible: bool = True
    why_not: str = ""
    arena: ArenaPlan | None = None      # where it runs with its arena: the arena plan the search priced


def shape_key(batch: Any) -> tuple[Any, ...]:
    """What a captured step is specialised to: the batch's structure, shapes and dtypes."""
    leaves, spec = pytree.tree_flatten(batch)
    return (pytree.treespec_dumps(spec),
            *((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else (type(t).__name__,) for t in leaves))


class Plan:
    """Optimized steps for one model, optimizer and batch shape, with their report.

    `plan.step(batch)` stands for `loss_fn(model, batch).backward(); clip; optimizer.step();
    optimizer.zero_grad()` (with accumulate=k: the backward on every call, the rest on
    every k-th). The optimizer (and GradScaler) are the user's objects. With max_grad_norm,
    `plan.grad_norm` is the gradients' total norm before clipping at the last update (the
    tensor clip_grad_norm_ returns).
    """

    def __init__(self, model: torch.nn.Module, graph: Graph, order: list[int], report: dict[str, Any], *,
                 optimizer: torch.optim.Optimizer | None = None, scaler: Any = None,
                 micro: Program | None = None, accumulate: int = 1,
                 replan: Callable[[Any], tuple[Program, Program | None]] | None = None,
                 batch: Any = None, arena: bool = False, placed: ArenaPlan | None = None) -> None:
        self.model = model
        self.arena = arena                      # its steps place their results in an arena (Step)
        # (placed: the planned batch shape's arena plan, as the search priced it; else each Step plans its own)
        self.graph = graph
        self.order = list(order)
        self.report = report
        self.optimizer = optimizer
        self.scaler = scaler
        self.accumulate = accumulate
        self.micro_steps = 0                    # micro-batches since the last update
        self.grad_norm: torch.Tensor | None = None   # total norm the last update clipped (max_grad_norm)
        self._replan = replan
        self._steps: dict[tuple[Any, ...], tuple[Step, Step | None]] = {}
        self._programs: dict[tuple[Any, ...], tuple[Program, Program | None]] = {}
        self._micro = micro
        self._specialised: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}   # shape -> programs for other counts
        self._held = held(graph.input_names)    # the closure tensors its constants bind to, kept alive
        self._key = shape_key(batch) if batch is not None else None
        if self._key is not None:
            self._programs[self._key] = (Program(graph, self.order, report, arena=placed), micro)

    @property
    def program(self) -> Step:
        """The runnable step of the planned batch shape (generated and imported on first use)."""
        return self._built(self._key)[0]

    @property
    def source(self) -> str:
        return self.program.source

    def _built(self, key: tuple[Any, ...] | None) -> tuple[Step, Step | None]:
        for other, steps in self._steps.items():     # one batch shape's arena held at a time
            if other != key:
                for step in steps:
                    if step is not None:
                        step.arena = None               # (made again when that shape comes back)
        found = self._steps.get(key)  # type: ignore[arg-type]
        if found is None:
            main, micro = self._programs.get(key) if key is not None else (None, None)  # type: ignore[misc]
            if main is None:
                main, micro = Program(self.graph, self.order, self.report), self._micro
            title = main.report.get("title", "peakcut plan")
            step = Step(main.graph, main.order, title=title, optimizer=self.optimizer, scaler=self.scaler,
                        arena=main.arena or self.arena)
            self.optimizer = step.update.optimizer_for(self.model)     # made from the plan if none given
            micro_step = (Step(micro.graph, micro.order, title=title + " (micro-batch)", scaler=self.scaler,
                               arena=micro.arena or self.arena)
                          if micro is not None else None)
            found = self._steps[key] = (step, micro_step)  # type: ignore[index]
        return found

    def _for_batch(self, batch: Any) -> tuple[Step, Step | None]:
        problem = batch_problem(batch)      # before its shape is read: a nested tensor has none
        if problem is not None:
            raise StepBindingError(f"{problem}, which a captured step cannot take")
        key = shape_key(batch)
        if self._specialised.get(key):      # the program of this shape that ran last
            return self._built(self._specialised[key][0])
        if self._key is None or key == self._key or key in self._programs:
            return self._built(key if key in self._programs else self._key)
        if self._replan is None:
            raise StepBindingError(f"batch of another shape or dtype ({_shapes(key)}; planned for "
                                   f"{_shapes(self._key)}) "
                                   "and replan=False: plan this shape with peakcut.optimize, or pass replan=True")
        t0 = time.perf_counter()
        try:
            self._programs[key] = self._replan(batch)
        except CaptureError as e:
            raise CaptureError(f"batch of another shape or dtype ({_shapes(key)}; planned for "
                               f"{_shapes(self._key)}) could not be planned: {e}") from e
        warnings.warn(f"peakcut: batch of a new shape or dtype ({_shapes(key)}; planned for "
                      f"{_shapes(self._key)}): "
                      f"planned again in {time.perf_counter() - t0:.1f} s; cached for this shape",
                      stacklevel=3)
        return self._built(key)

    def step(self, batch: Any) -> Any:
        """One optimized step on `batch`: returns the loss (or the model output for inference).
        A batch whose data-dependent sizes (a boolean mask's count) differ from those the step
        was specialised to is planned again, as a batch of a new shape is."""
        built = len(self._steps)
        main, micro = self._for_batch(batch)
        try:
            loss = self._run(main, micro, batch)
        except SpecializationError as e:
            return self._respecialised(batch, e)
        if len(self._steps) > built:
            # a program's first run built it (source, arena) and made the optimizer's state
            # between its own transient tensors: what that freed leaves the process (a heap that
            # keeps freed memory, as optimize may set it, would hold it for good)
            release_freed_host_memory()
        return loss

    def _respecialised(self, batch: Any, error: SpecializationError) -> Any:
        """Run `batch` with a program of its shape planned for its counts: one planned before
        (tried in turn; a guard fails before any update), else one planned now."""
        key = shape_key(batch)
        first = key if key in self._programs or self._key is None else self._key
        tried = self._specialised.setdefault(key, [first])
        for known in list(tried[1:]) if len(tried) > 1 else []:
            try:
                loss = self._run(*self._built(known), batch)
            except SpecializationError:
                continue
            tried.remove(known)
            tried.insert(0, known)
            return loss
        if self._replan is None:
            raise StepBindingError(f"{error}; replan=False: plan this batch with peakcut.optimize, or pass "
                                   "replan=True") from error
        t0 = time.perf_counter()
        new_key = (*key, ("specialised", len(tried)))
        try:
            self._programs[new_key] = self._replan(batch)
        except CaptureError as e:
            raise CaptureError(f"{error}; planning this batch again failed: {e}") from e
        tried.insert(0, new_key)
        warnings.warn(f"peakcut: {error}: planned again in {time.perf_counter() - t0:.1f} s; cached for "
                      "these counts", stacklevel=3)
        return self._run(*self._built(new_key), batch)

    def _run(self, main: Step, micro: Step | None, batch: Any) -> Any:
        if self.accumulate > 1 and self.micro_steps + 1 < self.accumulate:
            if micro is None:
                raise StepBindingError("accumulate > 1 but the plan has no micro-batch program")
            loss = micro(self.model, batch)
            self.micro_steps += 1
            return loss
        loss = main(self.model, batch)
        self.micro_steps = 0
        self.grad_norm = main.grad_norm
        return loss

    def save(self, path: str | Path) -> Path:
        """Write graph, order, report and program source into directory `path`."""
        if self.accumulate > 1:
            raise NotImplementedError("saving an accumulate=k plan is not supported yet (it holds two programs); "
                                      "plan again with peakcut.optimize after loading your checkpoint")
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / "graph.json").write_text(graph_to_json(self.graph))
        (out / "order.json").write_text(json.dumps(self.order))
        (out / "report.json").write_text(json.dumps(self.report, indent=2, default=str))
        (out / "program.py").write_text(self.source)
        return out

    def __repr__(self) -> str:
        r = self.report
        return (f"Plan(peak {format_bytes(r.get('peak_bytes', 0))} vs eager "
                f"{format_bytes(r.get('eager_peak_bytes', 0))}, latency {format_seconds(r.get('latency_s', 0))} vs "
                f"{format_seconds(r.get('eager_latency_s', 0))}, {len(plan_contents(r))} changes)")


def plan_contents(report: dict[str, Any]) -> list[str]:
    """What a plan does, one line each: its rewrites, fission regions and remat/swap/offload
    recipes (report entries made by optimizer.report.plan_entries); report["applied"] is the
    search's path to the plan instead."""
    regions = [f"fission: F-Tree node {f['ftree_node']} ({f['ops']} ops) in {f['n']} parts"
               for f in report.get("fission", [])]
    return [*report.get("rewrites", []), *regions, *report.get("recipes", [])]


def _shapes(key: tuple[Any, ...] | None) -> str:
    if key is None:
        return "?"
    return ", ".join(f"{'x'.join(map(str, k[0]))} {str(k[1]).removeprefix('torch.')}" if len(k) == 2 else k[0]
                     for k in key[1:])


def load_plan(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
              scaler: Any = None) -> Plan:
    """A saved plan, bound to `model` (the same architecture and parameter shapes) and to
    your optimizer (default: a fresh one made from the plan's description, plan.optimizer).
    A loaded plan runs the saved batch shape only (it cannot plan another one)."""
    src = Path(path)
    missing = [name for name in PLAN_FILES[:3] if not (src / name).exists()]
    if missing:
        raise FileNotFoundError(f"{src} is not a saved plan: missing {', '.join(missing)}")
    graph = graph_from_json((src / "graph.json").read_text())
    order = json.loads((src / "order.json").read_text())
    report = json.loads((src / "report.json").read_text())
    if sorted(order) != sorted(graph.nodes):
        raise ValueError(f"{src / 'order.json'} does not order the nodes of {src / 'graph.json'}")
    return Plan(model, graph, order, report, optimizer=optimizer, scaler=scaler)
