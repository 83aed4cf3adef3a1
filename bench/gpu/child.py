"""One workload in a process of its own: eager, the peers and a plan per limit on one model,
each from the same initial weights with a fresh AdamW (lr 1e-4), then the simulated figures.

Each configuration runs a first step (checked against the reference: eager's first step, or
where eager did not run, exact accumulation's), a step whose peak is measured, and its timed
steps (bench.gpu.measure). A plan is peakcut.optimize(model, batch, loss_fn, opt,
device="measured", <limit>, time_budget=...) and is timed as the user calls it, plan.step(batch).
A failure (out of memory included) is that configuration's entry, not the end of the
workload. The row so far is printed as one "ROW <json>" line after every phase, so a process
stopped at its slot still leaves what it measured. TF32 is off (matmul and cuDNN) for every
configuration, so that the number check is float32's.
"""

from __future__ import annotations

import json
import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

import peakcut
from bench.gpu import numbers, peers, simulated
from bench.gpu.measure import device_name, is_out_of_memory, measure, on_gpu, ratios, release
from bench.gpu.tables import size_text
from bench.gpu.timeplan import (
    LIMITS,
    MIN_BUDGET_S,
    child_budget,
    plan_measuring_seconds,
    simulate_seconds,
    step_seconds,
)
from bench.measured.configs import adamw, eager_step
from bench.peers.measure import caller_held_bytes
from peakcut.workloads import get_workload

TRIMMED = ("front", "ftree")        # report entries left out of the row (long lists)


def emit(row: dict[str, Any]) -> None:
    print("ROW " + json.dumps(row, default=str), flush=True)


def say(name: str, text: str) -> None:
    print(f"[{name} {time.strftime('%H:%M:%S')}] {text}", flush=True)


def _failure(e: BaseException) -> dict[str, Any]:
    last = traceback.format_exception_only(type(e), e)[-1].strip()
    return {"error": last[:500], "out_of_memory": is_out_of_memory(e)}


def _phases(report: dict[str, Any]) -> dict[str, Any]:
    """States searched and seconds in each phase of optimize, as far as the report gives them."""
    search = report.get("search") or {}
    out: dict[str, Any] = {"states": search.get("states"), "search_s": search.get("seconds"),
                           "search_total_s": search.get("total_seconds")}
    for key, entry in (("calibration_s", report.get("context")), ("verification_s", report.get("verification"))):
        if isinstance(entry, dict):
            out[key] = entry.get("seconds")
    for key in ("phases", "phase_seconds"):
        if isinstance(report.get(key), dict):
            out[key] = report[key]
    return out


class Workload:
    """The state of one workload's process: its instance, initial weights, reference and row."""

    def __init__(self, name: str, size: str, batch: int | None, slot: dict[str, Any]) -> None:
        self.name, self.slot = name, slot
        self.deadline = time.monotonic() + float(slot["seconds"])
        self.device = "cuda" if on_gpu() else "cpu"
        self.row: dict[str, Any] = {"workload": name, "size": size, "device": device_name(), "torch": torch.__version__,
                                    "cuda": torch.version.cuda, "slot": slot, "peers": {}, "limits": {},
                                    "skipped": list(slot.get("skipped", []))}
        t0 = time.perf_counter()
        self.inst = get_workload(name).build(size, batch_size=batch, device=self.device)
        self.model = self.inst.model
        self.init_state = {k: numbers.host_copy(v) for k, v in self.model.state_dict().items()}
        self.init = {n: self.init_state[n] for n, _ in self.model.named_parameters()}
        self.tol = numbers.tolerance(self.inst.dtype, max(t.numel() for t in self.inst.batch))
        self.ref: numbers.Reference | None = None
        self.step_s = 0.0
        self.row.update(description=self.inst.description, batch=self.inst.batch_size,
                        param_bytes=sum(p.numel() * p.element_size() for p in self.model.parameters()),
                        build_s=round(time.perf_counter() - t0, 2))
        say(name, f"built {self.inst.description} in {self.row['build_s']} s on {self.row['device']}")
        emit(self.row)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def restore(self) -> None:
        """The initial weights and buffers back on the device (a plan may keep parameters in host
        memory, by replacing their .data), no gradients; the device's cache emptied."""
        with torch.no_grad():
            for t in [*self.model.parameters(), *self.model.buffers()]:
                if t.device.type != self.device:
                    t.data = t.data.to(self.device)
            self.model.load_state_dict(self.init_state)
        for p in self.model.parameters():
            p.grad = None
        release()

    def run_config(self, label: str, opt: torch.optim.Optimizer, step: Callable[[], Any], runs: int,
                   expect: str = "") -> dict[str, Any]:
        """First step (the reference, or checked against it), peak and timed steps of one
        configuration; `expect` why its numbers are not expected to be eager's."""
        out: dict[str, Any] = {}
        try:
            loss = step()
            if self.ref is None and not expect:
                self.ref = numbers.reference(label, self.model, opt, loss, self.init)
                out["numbers"] = {"reference": label}
            elif self.ref is not None:
                out["numbers"] = dict(numbers.check(self.ref, self.model, opt, loss, self.tol),
                                      expected_equal=not expect, **({"why_not_exact": expect} if expect else {}))
            else:
                out["numbers"] = {"unchecked": f"no reference step ran ({expect})"}
            del loss
            out.update(measure(step, runs, caller_held_bytes(self.model, opt, self.inst.batch)))
        except Exception as e:      # noqa: BLE001 - a failing configuration is its entry
            out.update(_failure(e))
        return out

    def eager(self) -> None:
        runs = int(self.slot["runs"])
        opt = adamw(self.model)
        step = eager_step(self.model, opt, lambda: self.inst.loss_fn(self.model, self.inst.batch))
        self.row["eager"] = self.run_config("eager", opt, step, runs)
        del step, opt
        self.restore()
        e = self.row["eager"]
        self.step_s = e.get("median_s", 0.0)
        say(self.name, "eager: " + _figures(e))
        emit(self.row)

    def peers(self) -> None:
        for peer in peers.names():
            if self.left() <= 0:
                self.row["skipped"].append(f"{peer}: not run, the workload's slot is spent")
                continue
            opt = adamw(self.model)
            expect = peers.exactness(peer, self.name, self.model)
            try:
                with peers.applied(peer, self.name, self.model) as how:
                    step = peers.step_of(peer, self.model, self.inst.batch, self.inst.loss_fn, opt)
                    entry = dict(self.run_config(peer, opt, step, int(self.slot["peer_runs"]), expect), how=how)
            except Exception as e:      # noqa: BLE001 - a peer that cannot be set up is its entry
                entry = _failure(e)
            entry["ratios"] = ratios(entry, self.row.get("eager", {}))
            self.row["peers"][peer] = entry
            del opt
            self.restore()
            say(self.name, f"{peer}: " + _figures(entry))
            emit(self.row)

    def plans(self) -> dict[str, tuple[Any, list[int]]]:
        """Each limit's plan made and measured; their (graph, order) for the simulated figures."""
        graphs: dict[str, tuple[Any, list[int]]] = {}
        remaining = list(self.slot["limits"])
        while remaining:
            budget = self._budget(len(remaining))
            while budget <= 0 and len(remaining) > 1:      # the later limits give way to the first
                self._skip(remaining.pop())
                budget = self._budget(len(remaining))
            limit = remaining.pop(0)
            if budget <= 0:
                self._skip(limit)
                continue
            kind, value = LIMITS[limit]
            entry: dict[str, Any] = {"kind": kind, "value": value, "budget_s": round(budget, 1)}
            self.row["limits"][limit] = entry
            try:
                graphs[limit] = self.plan(entry, kind, value, budget)
            except Exception as e:      # noqa: BLE001 - a failing plan is its entry
                entry.update(_failure(e))
            entry["best_peer"] = peers.best(self.row["peers"], limit, value)
            entry["beats_best_peer"] = peers.beats(entry.get("ratios"), entry["best_peer"], limit, value)
            self.restore()
            say(self.name, f"plan at {limit} <= {value}: {entry.get('status', '')} " + _figures(entry.get("measured", entry)))
            emit(self.row)
        return graphs

    def _budget(self, limits: int) -> float:
        """The next optimize's time_budget with `limits` plans still to make (0: none fits); a
        budget the user gave is kept while the slot holds it."""
        if self.slot.get("fixed"):
            planned = float(self.slot["budget_s"])
            return planned if self.left() > planned else 0.0
        slowdown = float(self.slot.get("slowdown", 1.0))
        step_s = self.step_s or slowdown * step_seconds(self.name)
        measuring = limits * plan_measuring_seconds(step_s, int(self.slot["runs"])) + slowdown * simulate_seconds(self.name)
        return child_budget(float(self.slot["budget_s"]), self.left(), limits, measuring)

    def _skip(self, limit: str) -> None:
        least = min(MIN_BUDGET_S, float(self.slot["budget_s"]))
        self.row["skipped"].append(f"{limit} limit: not run, {self.left():.0f} s left of the slot: less than "
                                   f"{least:.0f} s of optimize besides measuring it")

    def plan(self, entry: dict[str, Any], kind: str, value: float, budget: float) -> tuple[Any, list[int]]:
        opt = adamw(self.model)
        before = _checksum(self.model)
        t0 = time.perf_counter()
        try:
            limit: dict[str, Any] = {kind: value}
            plan = peakcut.optimize(self.model, self.inst.batch, self.inst.loss_fn, opt, device="measured",
                                    time_budget=budget, **limit)
            entry["status"] = "limit met"
        except peakcut.LimitNotMet as e:
            plan = e.plan
            entry["status"] = f"LimitNotMet: {str(e).splitlines()[0][:300]}"
        entry["optimize_s"] = round(time.perf_counter() - t0, 2)
        entry["model_unchanged_by_optimize"] = _checksum(self.model) == before
        entry["report"] = {k: v for k, v in plan.report.items() if k not in TRIMMED}
        entry["phases"] = _phases(plan.report)
        entry["predicted"] = simulated.predicted(plan.report)
        emit(self.row)
        entry["measured"] = self.run_config(f"plan {kind}={value}", opt, lambda: plan.step(self.inst.batch),
                                            int(self.slot["runs"]))
        entry["ratios"] = ratios(entry["measured"], self.row.get("eager", {}))
        return plan.graph, list(plan.order)

    def simulated(self, graphs: dict[str, tuple[Any, list[int]]]) -> None:
        need = float(self.slot.get("slowdown", 1.0)) * simulate_seconds(self.name)
        if self.left() < need:
            self.row["skipped"].append(f"simulated figures on the device's profile: not made, {self.left():.0f} s "
                                       f"left of the slot, {need:.0f} s estimated")
            return
        say(self.name, "simulated figures on the device's profile")
        try:
            self.row["simulated"] = simulated.profile(self.inst, adamw(self.model), graphs, self.row["device"])
        except Exception as e:      # noqa: BLE001 - missing simulated figures are their entry
            self.row["simulated"] = _failure(e)
        emit(self.row)


def _checksum(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return math.fsum(p.detach().double().sum().item() for p in model.parameters())


def _figures(entry: dict[str, Any]) -> str:
    if "median_s" not in entry:
        return entry.get("error", "not measured")
    return (f"{entry['median_s'] * 1e3:.1f} ms, {size_text(entry['max_memory_allocated'])} allocated, "
            f"{size_text(entry['max_memory_reserved'])} reserved")


def prepare() -> None:
    """What a workload's process imports before it is told to go (nothing touches a device)."""
    import torch._functorch.partitioners  # noqa: F401 - selective checkpointing's op list


def run(name: str, size: str, batch: int | None, slot: dict[str, Any]) -> dict[str, Any]:
    """The workload's whole row (module doc); printed as it grows."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    w = Workload(name, size, batch, slot)
    w.eager()
    w.peers()
    graphs = w.plans()
    w.simulated(graphs)
    w.row["seconds"] = round(float(slot["seconds"]) - w.left(), 1)
    emit(w.row)
    return w.row
