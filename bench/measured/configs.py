"""The configurations compared at medium size, each as a zero-argument training step.

A Config builds its own copy of the workload's model (from the same initial weights), its
own torch.optim.AdamW, and a step: loss, backward, update, grads set to None, as in the
user's eager loop. peakcut's configurations are planned here (peakcut.optimize with the
user's AdamW, device="measured"): the plan's report rides along for the tables.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

import peakcut
from bench.peers.tools import apply_checkpointing
from peakcut.workloads import WorkloadInstance

COMPILE_BUDGETS: tuple[float, ...] = (0.6, 0.4, 0.2)
PEAKCUT_LIMITS: tuple[tuple[str, float], ...] = (("latency_limit", 1.10), ("memory_limit", 0.5))
LR = 1e-4


def config_names() -> list[str]:
    """Every configuration's name, in table order (eager first)."""
    return (["eager", "checkpoint per block"]
            + [f"compile aot_eager budget {b:.1f}" for b in COMPILE_BUDGETS]
            + [peakcut_name(k, v) for k, v in PEAKCUT_LIMITS])


def peakcut_name(kind: str, value: float) -> str:
    return f"peakcut latency <= {value:.2f}x" if kind == "latency_limit" else f"peakcut memory <= {value:.0%}"


class Refused(Exception):
    """peakcut refused the limit before searching: it is below what the step holds between
    steps on this CPU (the plan report's "unreachable"); nothing to measure."""


@dataclass
class Built:
    """One configuration ready to run: its step, model and optimizer (for the peak's
    caller-held bytes), and what planning said."""

    name: str
    step: Callable[[], Any]
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    setup_seconds: float = 0.0
    budget_seconds: float = 0.0
    note: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    plan: Any = None


def adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=LR)


def eager_step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss_of: Callable[[], torch.Tensor]
               ) -> Callable[[], torch.Tensor]:
    """The user's loop: loss, backward, AdamW step, grads to None; returns the loss."""
    params = list(model.parameters())

    def step() -> torch.Tensor:
        loss = loss_of()
        loss.backward()
        opt.step()
        for p in params:
            p.grad = None
        return loss.detach()

    return step


def build_eager(inst: WorkloadInstance, name: str = "eager") -> Built:
    model = copy.deepcopy(inst.model).train()
    opt = adamw(model)
    note = apply_checkpointing(inst.name, model) if name == "checkpoint per block" else ""
    return Built(name, eager_step(model, opt, lambda: inst.loss_fn(model, inst.batch)), model, opt, note=note)


def build_compiled(inst: WorkloadInstance, budget: float) -> Built:
    """torch.compile (aot_eager) of the loss under activation_memory_budget; compiled by the
    first call, which runs under the budget's config patch (warm-up does it)."""
    model = copy.deepcopy(inst.model).train()
    opt = adamw(model)
    compiled = torch.compile(lambda b: inst.loss_fn(model, b), backend="aot_eager")
    name = f"compile aot_eager budget {budget:.1f}"
    t0 = time.perf_counter()
    with torch._functorch.config.patch(activation_memory_budget=budget, enable_autograd_cache=False):
        step = eager_step(model, opt, lambda: compiled(inst.batch))
        step()                                            # compiles
    return Built(name, step, model, opt, setup_seconds=time.perf_counter() - t0, note="compiled on step 1")


def build_peakcut(inst: WorkloadInstance, kind: str, value: float, budget: float) -> Built:
    """peakcut.optimize on a fresh copy with its AdamW; the plan's step (LimitNotMet: the
    best plan, noted)."""
    model = copy.deepcopy(inst.model).train()
    opt = adamw(model)
    t0 = time.perf_counter()
    note = ""
    try:
        plan = peakcut.optimize(model, inst.batch, inst.loss_fn, opt, device="measured",
                                time_budget=budget, **{kind: value})
    except peakcut.LimitNotMet as e:
        floor = e.plan.report.get("unreachable")
        if floor is not None:
            raise Refused(f"refused in {time.perf_counter() - t0:.0f} s: limit {floor['limit_bytes'] / 2**30:.2f} "
                          f"< held {floor['held_bytes'] / 2**30:.2f} GiB") from e
        plan, note = e.plan, f"LimitNotMet: {str(e).splitlines()[0][:200]}"
    name = peakcut_name(kind, value)

    def step() -> torch.Tensor:
        return plan.step(inst.batch)

    return Built(name, step, model, opt, setup_seconds=time.perf_counter() - t0, budget_seconds=budget, note=note,
                 report=plan.report, plan=plan)
