"""The peer configurations ("tools") and how each one wraps a workload's model.

A Tool is one row of the tables: eager PyTorch, per-block activation checkpointing,
torchtitan's selective activation checkpointing, gradient accumulation over k
micro-batches, torch.compile with an activation-memory budget (backend x budget x solver),
the ZeRO-Offload-style peer (simulated only), or peakcut.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bench.peers.accumulate import KS
from bench.peers.sac import SOURCE, save_ops, selectively_checkpointed

BUDGETS: tuple[float, ...] = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)
SOLVERS: tuple[str, ...] = ("dp", "greedy", "ilp")
BACKENDS: tuple[str, ...] = ("aot_eager", "inductor")
FAMILIES: tuple[str, ...] = ("eager", "checkpoint", "sac", "accumulate", "compile", "offload", "peakcut")
NAMES = {"eager": "eager", "checkpoint": "checkpoint per block", "sac": "selective checkpoint (torchtitan)",
         "offload": "ZeRO-Offload"}
PEAKCUT_LIMITS: tuple[str, ...] = ("memory 0.5", "latency 1.1")   # peakcut's two modes


@dataclass(frozen=True)
class Tool:
    """One configuration compared in the tables."""

    family: str                 # one of FAMILIES
    backend: str = ""           # compile: "aot_eager" | "inductor"
    budget: float = 1.0         # compile: torch._functorch.config.activation_memory_budget
    solver: str = "dp"          # compile: activation_memory_budget_solver
    limit: str = ""             # peakcut: "memory 0.5" | "latency 1.1"
    k: int = 0                  # accumulate: micro-batches per step

    @property
    def name(self) -> str:
        if self.family == "compile":
            return f"compile {self.backend} budget {self.budget:.1f} {self.solver}"
        if self.family == "peakcut":
            mode, value = self.limit.split()
            return (f"peakcut memory <= {float(value):.0%}" if mode == "memory"
                    else f"peakcut latency <= {float(value):.2f}x")
        if self.family == "accumulate":
            return f"grad accumulation k={self.k}"
        return NAMES[self.family]

    @property
    def curve(self) -> str:
        """Pareto-plot curve this tool belongs to."""
        if self.family == "compile":
            return f"compile {self.backend} {self.solver}"
        if self.family == "accumulate":
            return "grad accumulation"
        return "peakcut" if self.family == "peakcut" else self.name

    def config(self) -> contextlib.AbstractContextManager[Any]:
        """torch._functorch.config patch for this tool (a no-op outside compile)."""
        if self.family != "compile":
            return contextlib.nullcontext()
        return torch._functorch.config.patch(
            activation_memory_budget=self.budget,
            activation_memory_budget_solver=self.solver,
            enable_autograd_cache=False,  # every budget must really be partitioned
        )


def compile_tools(backends: tuple[str, ...] = BACKENDS, budgets: tuple[float, ...] = BUDGETS,
                  solvers: tuple[str, ...] = SOLVERS) -> list[Tool]:
    """Budget sweep. Budgets 1.0 and 0.0 do not run a knapsack, so only one solver (dp) there."""
    tools = []
    for backend in backends:
        for budget in budgets:
            for solver in solvers:
                if budget in (0.0, 1.0) and solver != solvers[0]:
                    continue
                tools.append(Tool("compile", backend, budget, solver))
    return tools


def all_tools(families: tuple[str, ...] = FAMILIES, backends: tuple[str, ...] = BACKENDS,
              budgets: tuple[float, ...] = BUDGETS, solvers: tuple[str, ...] = SOLVERS) -> list[Tool]:
    """Every row, in table order."""
    tools: list[Tool] = []
    for family in families:
        if family == "compile":
            tools += compile_tools(backends, budgets, solvers)
        elif family == "peakcut":
            tools += [Tool("peakcut", limit=limit) for limit in PEAKCUT_LIMITS]
        elif family == "accumulate":
            tools += [Tool("accumulate", k=k) for k in KS]
        else:
            tools.append(Tool(family))
    return tools


# ------------------------------------------------------------------ checkpointing
def checkpoint_blocks(workload: str, model: nn.Module) -> list[nn.Module]:
    """The blocks wrapped in torch.utils.checkpoint for models without HF's switch."""
    if workload == "resnet50":
        return [model.layer1, model.layer2, model.layer3, model.layer4]  # stages
    if workload == "unet":
        return [model.inc, *model.downs, *model.up_convs]  # double-conv blocks
    if workload == "unetpp":
        return list(model.nodes.values())  # the nested double-conv nodes X[i][j]
    if workload == "btlm-3b":
        return list(model.transformer.h)  # decoder layers
    raise ValueError(f"no checkpoint blocks defined for {workload!r}")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer layers of a transformers model (its GradientCheckpointingLayer modules)."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def sac_blocks(workload: str, model: nn.Module) -> list[nn.Module]:
    """The blocks selective checkpointing wraps: transformer layers, else checkpoint_blocks."""
    return transformer_blocks(model) or checkpoint_blocks(workload, model)


def _checkpointed(forward: Any) -> Any:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def apply_checkpointing(workload: str, model: nn.Module) -> str:
    """Checkpoint every block of `model` in place; returns how (for the report)."""
    if getattr(model, "supports_gradient_checkpointing", False):
        # transformers 5 renamed gradient_checkpointing_enable (deprecated) to activation_checkpointing_enable
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
            return "HF activation_checkpointing_enable (per transformer layer)"
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return "HF gradient_checkpointing_enable (per transformer layer)"
    blocks = checkpoint_blocks(workload, model)
    for block in blocks:
        block.forward = _checkpointed(block.forward)
    return f"torch.utils.checkpoint around {len(blocks)} blocks"


def apply_selective_checkpointing(workload: str, model: nn.Module) -> str:
    """torchtitan's default selective checkpointing (bench.peers.sac) on every block of `model`,
    in place (parameter names unchanged); returns how (for the report)."""
    blocks = sac_blocks(workload, model)
    saved = save_ops()
    for block in blocks:
        block.forward = selectively_checkpointed(block.forward, saved)
    return f"{SOURCE} around {len(blocks)} blocks"


@contextlib.contextmanager
def fresh_dynamo() -> Iterator[None]:
    """torch._dynamo.reset() before and after a compiled configuration."""
    torch._dynamo.reset()
    try:
        yield
    finally:
        torch._dynamo.reset()
