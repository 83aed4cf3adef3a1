"""The transformers Trainer, training through peakcut plans.

    from peakcut.integrations.transformers import Trainer      # instead of transformers' Trainer
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      peakcut=dict(memory_limit=0.5, device="measured", time_budget=60))
    trainer.train()

The first training batch of each shape is planned (peakcut.optimize over the Trainer's own
loss: compute_loss, its autocast, its loss scaling for accumulation); every training step
then runs the plan, which does the backward, the clipping at `max_grad_norm`, the
optimizer's update and zero_grad as the Trainer would. The Trainer's optimizer, param
groups, LR scheduler, GradScaler, logging (the loss and the `grad_norm` the plan clipped
with), evaluation, checkpoints and resume_from_checkpoint are unchanged. A setting a plan
cannot run (peakcut.integrations.transformers_settings.unsupported_setup), or a batch that
cannot be planned, trains with transformers' own step, with a warning that names it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any, cast

import torch

from peakcut import CaptureError, LimitNotMet, Plan, StepBindingError, optimize
from peakcut.integrations.transformers_settings import PeakcutSettings, clip_norm, unsupported_setup

try:
    import transformers
    from accelerate.utils.memory import (  # type: ignore[import-untyped, import-not-found, unused-ignore]
        clear_device_cache,
    )
except ImportError as error:        # the package installs without them
    raise ImportError("peakcut.integrations.transformers needs transformers (and its Accelerate): "
                      "pip install peakcut[transformers]") from error

LOOP_HOOKS = ("_prepare_for_training", "_clip_grad_norm", "_get_grad_norm", "training_step")
if not all(hasattr(transformers.Trainer, name) for name in LOOP_HOOKS):
    raise ImportError(f"peakcut.integrations.transformers needs a transformers Trainer with {', '.join(LOOP_HOOKS)} "
                      f"(as transformers 5.25 has; this is {transformers.__version__}): pip install -U peakcut[transformers]")

__all__ = ["PeakcutSettings", "Trainer"]

PLAN_ERRORS = (CaptureError, StepBindingError, TypeError, ValueError, NotImplementedError)


class _StepDone:
    """The Trainer's optimizer while plans train: its step() does nothing after a plan's
    update (the plan has stepped the optimizer), and steps it otherwise (a step transformers
    ran itself). Everything else is the wrapped optimizer's."""

    wrapped: Any            # the Trainer's optimizer (Accelerate's AcceleratedOptimizer)
    planned: bool           # a plan ran this update; the next step() is skipped

    def __init__(self, wrapped: Any) -> None:
        object.__setattr__(self, "wrapped", wrapped)
        object.__setattr__(self, "planned", False)

    def step(self, closure: Any = None) -> Any:
        if not self.planned:
            return self.wrapped.step(closure)
        object.__setattr__(self, "planned", False)
        object.__setattr__(self.wrapped, "_opt_called", True)   # what the LR scheduler's step check reads
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "planned":
            object.__setattr__(self, name, value)
        else:
            setattr(self.wrapped, name, value)


class Trainer(transformers.Trainer):
    """transformers.Trainer whose training steps run peakcut plans.

    The constructor is transformers.Trainer's, plus `peakcut=dict(memory_limit=...,
    latency_limit=..., device=..., time_budget=..., max_states=..., seed=...)` (the
    search of each plan; see PeakcutSettings). After training, `trainer.peakcut_plan` holds the plan
    (its `.report`, `.source`) and `trainer.peakcut_fallbacks` each reason a step ran
    without one.
    """

    def __init__(self, *args: Any, peakcut: Mapping[str, Any] | PeakcutSettings | None = None,
                 **kwargs: Any) -> None:
        self.peakcut_settings = PeakcutSettings.from_argument(peakcut)
        super().__init__(*args, **kwargs)
        self.peakcut_plan: Plan | None = None
        self.peakcut_fallbacks: list[str] = []
        self._unsupported: str | None = None
        self._gate: _StepDone | None = None      # self.optimizer while plans train
        self._planned_norm: torch.Tensor | None = None

    # ------------------------------------------------------------------ the training loop
    def train(self, *args: Any, **kwargs: Any) -> Any:
        """transformers' train(), its steps through a plan made on the first batch."""
        self.peakcut_plan, self._unsupported = None, None
        try:
            return super().train(*args, **kwargs)
        finally:
            if self._gate is not None:
                self.optimizer, self._gate = self._gate.wrapped, None

    def _prepare_for_training(self, *args: Any, **kwargs: Any) -> Any:
        model, dataloader = super()._prepare_for_training(*args, **kwargs)
        self._unsupported = unsupported_setup(self)
        if self._unsupported is None:
            self._gate = _StepDone(self.optimizer)
            self.optimizer = cast(torch.optim.Optimizer, self._gate)    # it stands for the optimizer
        else:
            self._fall_back(self._unsupported)
        return model, dataloader

    def training_step(self, model: torch.nn.Module, inputs: dict[str, Any],
                      num_items_in_batch: torch.Tensor | int | None = None) -> torch.Tensor:
        """One micro-batch through the plan (the update too on the last of an accumulation
        group); transformers' own step where the plan cannot run it."""
        gate = self._gate
        if self._unsupported is not None or gate is None:
            return super().training_step(model, inputs, num_items_in_batch)
        model.train()
        if hasattr(gate.wrapped, "train") and callable(gate.wrapped.train):
            gate.wrapped.train()
        batch = self._batch(self._prepare_inputs(inputs), num_items_in_batch)
        sync = self.accelerator.sync_gradients
        try:
            plan = self._plan(model, batch, gate)
            if plan is None:
                return super().training_step(model, inputs, num_items_in_batch)
            loss = self._run(plan, gate, batch, sync)
        except PLAN_ERRORS as error:
            self._fall_back(f"this batch could not run through a plan ({type(error).__name__}: {error})")
            return super().training_step(model, inputs, num_items_in_batch)
        if sync:
            gate.planned = True
            self._planned_norm = plan.grad_norm
        every = self.args.torch_empty_cache_steps
        if every is not None and self.state.global_step % every == 0:
            clear_device_cache()
        return loss.detach()

    def _run(self, plan: Plan, gate: _StepDone, batch: dict[str, Any], sync: bool) -> torch.Tensor:
        """plan.step on one micro-batch: the update (and its clip) on the Trainer's sync step,
        gradients added to p.grad on the others (the accumulation group may be shorter at an
        epoch's end). The GradScaler's skip is told to Accelerate, which gates the scheduler."""
        if plan.accumulate > 1:
            plan.micro_steps = plan.accumulate - 1 if sync else 0
            if sync:            # a group of one micro-batch: nothing accumulated yet
                for group in gate.param_groups:
                    for p in group["params"]:
                        if p.requires_grad and p.grad is None:
                            p.grad = torch.zeros_like(p)
        scaler = plan.scaler
        scale = scaler.get_scale() if sync and scaler is not None and scaler.is_enabled() else None
        loss = plan.step(batch)
        if scale is not None:
            gate.wrapped._is_overflow = scaler.get_scale() < scale
        return loss

    def _batch(self, inputs: dict[str, Any], num_items_in_batch: torch.Tensor | int | None) -> dict[str, Any]:
        """What a plan takes as its batch: the inputs, and as tensors what the Trainer's loss
        reads that changes from step to step (the tokens counted over the accumulation
        group, the number of micro-batches in it)."""
        batch: dict[str, Any] = {"inputs": inputs}
        if num_items_in_batch is not None:
            batch["num_items_in_batch"] = torch.as_tensor(num_items_in_batch, device=self.args.device)
        if not self._loss_scaled_for_ga(num_items_in_batch):
            batch["micro_batches"] = torch.tensor(self.current_gradient_accumulation_steps, device=self.args.device)
        return batch

    def _loss_scaled_for_ga(self, num_items_in_batch: Any) -> bool:
        """Whether compute_loss already scaled the loss for accumulation (transformers' rule)."""
        scaled = getattr(self, "loss_is_scaled_for_ga", None)
        if scaled is not None:
            return bool(scaled)
        return bool((self.model_accepts_loss_kwargs and num_items_in_batch is not None)
                    or self.compute_loss_func is not None)

    def _loss(self, model: Any, batch: dict[str, Any]) -> torch.Tensor:
        """The Trainer's loss on a plan's batch, as its training_step computes it before the
        backward (peakcut traces it once per batch shape)."""
        num_items = batch.get("num_items_in_batch")
        with self.compute_loss_context_manager():
            loss = self.compute_loss(model, dict(batch["inputs"]), num_items_in_batch=num_items)
        if "micro_batches" in batch:
            loss = loss / batch["micro_batches"]
        return cast(torch.Tensor, loss)

    def _plan(self, model: torch.nn.Module, batch: dict[str, Any], gate: _StepDone) -> Plan | None:
        """The plan, made on the first batch (None, after a warning, where none can be made)."""
        if self.peakcut_plan is not None:
            return self.peakcut_plan
        settings = self.peakcut_settings
        optimizer = gate.wrapped
        scaler = getattr(self.accelerator, "scaler", None)
        try:
            plan = optimize(
                model, batch, self._loss, optimizer=getattr(optimizer, "optimizer", optimizer),
                max_grad_norm=clip_norm(self.args.max_grad_norm), scaler=scaler,
                accumulate=self.args.gradient_accumulation_steps, replan=True, **settings.search())
        except LimitNotMet as error:
            warnings.warn(f"peakcut: {error}; training with the best plan found", stacklevel=3)
            plan = error.plan
        except PLAN_ERRORS as error:
            self._unsupported = f"{type(error).__name__}: {error}"
            self._fall_back(self._unsupported)
            return None
        self.peakcut_plan = plan
        return plan

    def _fall_back(self, reason: str) -> None:
        """Warn, once per reason, that steps train with transformers' own step."""
        if reason not in self.peakcut_fallbacks:
            self.peakcut_fallbacks.append(reason)
            warnings.warn(f"peakcut: training with transformers' own step: {reason}", stacklevel=3)

    # ------------------------------------------------------------------ what the loop reads
    def _clip_grad_norm(self, model: torch.nn.Module) -> Any:
        """The norm the plan clipped at (it clipped already); transformers' clip otherwise."""
        if self._stepped_by_plan():
            return self._planned_norm
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model: torch.nn.Module, grad_norm: Any = None) -> Any:
        """The gradients' norm the Trainer logs: the plan's (its clip at infinity when the
        Trainer does not clip), else transformers'."""
        if grad_norm is None and self._stepped_by_plan():
            grad_norm = self._planned_norm
        return super()._get_grad_norm(model, grad_norm=grad_norm)

    def _stepped_by_plan(self) -> bool:
        return self._gate is not None and self._gate.planned
