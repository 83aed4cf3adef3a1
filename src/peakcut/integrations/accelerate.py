"""peakcut in an Accelerate loop: a plan for the model and optimizer `accelerator.prepare` returned.

    model, opt, sched = accelerator.prepare(model, opt, sched)
    plan = peakcut.integrations.accelerate.optimize(accelerator, model, batch, loss_fn, opt,
                                                    max_grad_norm=1.0, memory_limit=0.5)
    for batch in loader:
        with accelerator.accumulate(model):     # only with gradient_accumulation_steps > 1
            loss = plan.step(batch)             # was: accelerator.backward(loss); clip; step; zero_grad
            sched.step()

The plan runs the step as Accelerate configures it in one process: its mixed precision
(the autocast `prepare` wrapped around `model.forward` is captured with the forward; fp16
uses `accelerator.scaler`), its `gradient_accumulation_steps` (the loss divided by them, as
`accelerator.backward` does, and the update on the micro-batch where Accelerate syncs), and
the AcceleratedOptimizer's inner torch optimizer, whose state and param groups stay the
ones Accelerate checkpoints (`accelerator.save_state` / `load_state`). A multi-process
Accelerator (DDP, FSDP, DeepSpeed, ...) is refused: a captured step is one process's step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from peakcut.optimizer import Plan
from peakcut.optimizer import optimize as peakcut_optimize

EXTRA = "pip install peakcut[accelerate]"


def _accelerate() -> Any:
    try:
        import accelerate  # type: ignore[import-untyped, import-not-found, unused-ignore]
    except ImportError as e:
        raise ImportError(f"peakcut.integrations.accelerate needs Accelerate: {EXTRA}") from e
    return accelerate


class AcceleratedPlan:
    """A peakcut Plan in an Accelerate loop: `step(batch)` replaces `accelerator.backward(loss)`,
    clipping, `optimizer.step()` and `optimizer.zero_grad()` and returns the loss (undivided by
    gradient_accumulation_steps, up to rounding). Every other attribute is the Plan's."""

    def __init__(self, plan: Plan, accelerator: Any, optimizer: Any) -> None:
        self.plan = plan
        self.accelerator = accelerator
        wraps = isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer)
        self._wrapper = optimizer if wraps else None        # the AcceleratedOptimizer, whose step_was_skipped we set

    def step(self, batch: Any) -> Any:
        """One step on `batch` through the plan; the AcceleratedOptimizer's step_was_skipped and
        the scaler are updated as `optimizer.step()` updates them."""
        plan, k = self.plan, self.plan.accumulate
        updates = plan.micro_steps + 1 >= k
        if k > 1 and bool(self.accelerator.sync_gradients) != updates:
            raise ValueError(
                f"Accelerate {'syncs' if self.accelerator.sync_gradients else 'does not sync'} gradients on this "
                f"micro-batch but the plan {'updates' if updates else 'accumulates'} (micro-batch "
                f"{plan.micro_steps + 1} of gradient_accumulation_steps={k}): call plan.step inside "
                "`with accelerator.accumulate(model):`, with a number of batches per epoch divisible by "
                "gradient_accumulation_steps")
        scaler = plan.scaler
        scale = scaler.get_scale() if scaler is not None and scaler.is_enabled() and updates else None
        loss = plan.step(batch)
        if scale is not None and self._wrapper is not None:     # skipped: the scaler backed off (or held)
            self._wrapper._is_overflow = scaler._get_growth_tracker() == 0 and scaler.get_scale() <= scale
        return loss * k if k > 1 else loss

    def __getattr__(self, name: str) -> Any:
        if name == "plan":          # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.plan, name)

    def __repr__(self) -> str:
        return f"AcceleratedPlan({self.plan!r})"


def check_accelerator(accelerator: Any) -> None:
    """Refuse what a one-process captured step cannot run: several processes, a distributed
    type other than NO, fp8."""
    accelerate = _accelerate()
    if not isinstance(accelerator, accelerate.Accelerator):
        raise TypeError(f"accelerator: expected an accelerate.Accelerator, got {type(accelerator).__name__}")
    kind = accelerator.distributed_type
    if accelerator.num_processes > 1 or kind != accelerate.DistributedType.NO:
        raise ValueError(f"accelerator: {accelerator.num_processes} processes, distributed_type={kind.value}: "
                         "peakcut.integrations.accelerate plans one process's step (DistributedType.NO); "
                         "multi-process Accelerate (DDP, FSDP, DeepSpeed) is not supported")
    if accelerator.mixed_precision not in ("no", "bf16", "fp16"):
        raise ValueError(f"accelerator: mixed_precision={accelerator.mixed_precision!r} is not supported "
                         "(peakcut plans 'no', 'bf16' and 'fp16')")


def optimize(accelerator: Any, model: torch.nn.Module, batch: Any, loss_fn: Callable[..., Any],
             optimizer: Any, **kwargs: Any) -> AcceleratedPlan:
    """peakcut.optimize for a model and optimizer from `accelerator.prepare`.

    optimizer: the AcceleratedOptimizer (or a torch.optim SGD / Adam / AdamW); its inner
    optimizer is the one the plan updates. kwargs: peakcut.optimize's (max_grad_norm for
    accelerator.clip_grad_norm_, memory_limit, device, time_budget, ...); scaler and
    accumulate come from the accelerator."""
    check_accelerator(accelerator)
    for name in ("scaler", "accumulate"):
        if name in kwargs:
            raise TypeError(f"{name}= comes from the accelerator (its scaler and gradient_accumulation_steps); "
                            "do not pass it")
    inner = optimizer
    while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
        inner = inner.optimizer
    k = int(accelerator.gradient_accumulation_steps)
    step_loss = loss_fn if k == 1 else _Divided(loss_fn, k)
    plan = peakcut_optimize(model, batch, step_loss, inner, scaler=accelerator.scaler, accumulate=k, **kwargs)
    return AcceleratedPlan(plan, accelerator, optimizer)


class _Divided:
    """loss_fn(model, batch) / k, as accelerator.backward divides the loss it is given."""

    def __init__(self, loss_fn: Callable[..., Any], k: int) -> None:
        self.loss_fn, self.k = loss_fn, k

    def __call__(self, model: torch.nn.Module, batch: Any) -> Any:
        return self.loss_fn(model, batch) / self.k
