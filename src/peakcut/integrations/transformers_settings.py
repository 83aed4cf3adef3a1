"""What the peakcut Trainer reads besides transformers: the `peakcut=` settings, and the
Trainer features a plan cannot run (each named, so that the Trainer falls back to its own
step with a warning that says which)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from peakcut.optimizer.objective import parse_latency_limit, parse_memory_limit

PLANNED_OPTIMIZERS = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


@dataclass(frozen=True)
class PeakcutSettings:
    """The search a Trainer's plans are made with (peakcut.optimize's arguments of the same
    names). Neither limit: a latency limit of 1.10 x the eager step."""

    memory_limit: float | int | str | None = None
    latency_limit: float | str | None = None
    device: str = "measured"        # time each op on the device the Trainer trains on
    time_budget: float = 60.0       # seconds per plan (one per batch shape)
    max_states: int | None = None
    seed: int = 0
    arena: bool | None = None       # None: optimize's default (peakcut.optimizer.arena.arena_by_default)

    @classmethod
    def from_argument(cls, given: Mapping[str, Any] | PeakcutSettings | None) -> PeakcutSettings:
        """The settings from the Trainer's `peakcut=` argument (a dict, settings, or None)."""
        if given is None:
            return cls()
        if isinstance(given, PeakcutSettings):
            return given
        if not isinstance(given, Mapping):
            raise TypeError(f"peakcut: expected a dict of settings, got {type(given).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise TypeError(f"peakcut: unknown setting {unknown[0]!r}; expected some of {sorted(known)}")
        settings = cls(**given)
        settings.check()
        return settings

    def check(self) -> None:
        """Refuse, by name, a setting peakcut.optimize would refuse (before training starts)."""
        if self.memory_limit is not None and self.latency_limit is not None:
            raise ValueError("peakcut: give memory_limit or latency_limit, not both (the other is minimized)")
        parse_memory_limit(self.memory_limit, 1 << 30)       # the format; the eager peak is not known yet
        parse_latency_limit(self.latency_limit, 1.0)
        if not isinstance(self.device, str):
            raise TypeError(f"peakcut: device={self.device!r}: expected a cost model's name ('measured', 'h100', ...)")
        budget = self.time_budget
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget >= 0:
            raise ValueError(f"peakcut: time_budget={budget!r}: expected seconds >= 0")
        states = self.max_states
        if states is not None and (isinstance(states, bool) or not isinstance(states, int) or states < 1):
            raise ValueError(f"peakcut: max_states={states!r}: expected None or a number of states >= 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"peakcut: seed={self.seed!r}: expected an integer")
        if self.arena is not None and not isinstance(self.arena, bool):
            raise ValueError(f"peakcut: arena={self.arena!r}: expected True, False or None")

    def search(self) -> dict[str, Any]:
        """peakcut.optimize's keyword arguments for the search."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def clip_norm(max_grad_norm: float) -> float:
    """The max_grad_norm a plan clips with: the Trainer's, or infinity where it does not clip
    (the Trainer still logs the gradients' norm; a clip at infinity scales by exactly 1)."""
    return max_grad_norm if max_grad_norm > 0 else math.inf


def unsupported_setup(trainer: Any) -> str | None:
    """The Trainer setting a plan cannot run, in words, or None. Checked once per train()."""
    args = trainer.args
    accelerator = trainer.accelerator
    if trainer.is_deepspeed_enabled:
        return "DeepSpeed (a plan is one process's step; DeepSpeed runs its own engine)"
    if trainer.is_fsdp_enabled or getattr(trainer, "is_fsdp_xla_enabled", False):
        return "FSDP (a captured step is one process's step)"
    if accelerator.num_processes > 1:
        return f"distributed training over {accelerator.num_processes} processes (a plan is one process's step)"
    if args.n_gpu > 1:
        return f"DataParallel over {args.n_gpu} GPUs (a plan is one process's step)"
    if getattr(args, "torch_compile", False):
        return "torch_compile=True (peakcut captures the eager module)"
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    if type(optimizer) not in PLANNED_OPTIMIZERS:
        return (f"optimizer {type(optimizer).__name__} (optim={args.optim!s}): a plan runs torch.optim's SGD, "
                "Adam and AdamW")
    return None
