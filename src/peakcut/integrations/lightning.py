"""peakcut in Lightning: a single-device Strategy whose training step runs a peakcut plan.

    trainer = lightning.Trainer(accelerator="cpu", devices=1, gradient_clip_val=1.0,
                                strategy=PlanStrategy(peakcut=dict(memory_limit=0.5, device="cpu")))
    trainer.fit(module)

A Strategy, because the strategy is the one object Lightning asks for the training step,
the backward and the optimizer step: PlanStrategy answers the first with the plan's step
(forward, loss, backward, clipping, update, zero_grad) and makes the other two no-ops, so the
Trainer's loop, callbacks, logging, schedulers, validation and checkpoints stay Lightning's.
The plan is made on the first training batch (after a `ckpt_path` resume restored the
optimizer) from the module's `training_step` (its loss is loss_fn's), the optimizer from
`configure_optimizers`, the Trainer's `gradient_clip_val` (by norm), its
`accumulate_grad_batches` (when it divides the batches per epoch) and its precision
("32-true", "bf16-mixed", "16-mixed" with its GradScaler). One device, automatic
optimization, one optimizer; what a plan cannot do as the Trainer would is refused by name.

training_step's Python code runs when the step is planned, not at each step: `self.log` of
the returned loss is logged again after every step; any other value it logs is not (a
warning names it), and the integers it reads (batch_idx, global_step) keep the values they
had then.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from peakcut.optimizer import Plan, optimize

try:
    import lightning.pytorch as pl  # type: ignore[import-not-found, unused-ignore]
    from lightning.pytorch.plugins.precision import MixedPrecision, Precision  # type: ignore[import-not-found, unused-ignore]
    from lightning.pytorch.strategies import SingleDeviceStrategy  # type: ignore[import-not-found, unused-ignore]
except ImportError as e:
    raise ImportError("peakcut.integrations.lightning needs Lightning (the `lightning` package): "
                      "pip install peakcut[lightning]") from e

SET_BY_TRAINER = ("optimizer", "max_grad_norm", "scaler", "accumulate")
# LightningModule hooks whose code a plan would not run (it has no separate backward or update)
REFUSED_HOOKS = ("backward", "on_before_backward", "on_after_backward", "on_before_optimizer_step",
                 "configure_gradient_clipping")


class PlanStrategy(SingleDeviceStrategy):  # type: ignore[misc, unused-ignore]
    """SingleDeviceStrategy whose automatic-optimization training step is a peakcut plan.

    device: the torch device to train on (as SingleDeviceStrategy's). peakcut: the options of
    peakcut.optimize (memory_limit, latency_limit, device: the cost model, time_budget,
    max_states, ...); the optimizer, clipping and GradScaler come from the Trainer."""

    strategy_name = "peakcut"

    def __init__(self, device: Any = "cpu", *, peakcut: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(device=device, **kwargs)
        options = dict(peakcut or {})
        given = sorted(set(options) & set(SET_BY_TRAINER))
        if given:
            raise ValueError(f"peakcut: {', '.join(given)} come from the Trainer and configure_optimizers "
                             "(gradient_clip_val, precision); do not pass them")
        self.peakcut_options = options
        self.plan: Plan | None = None
        self._planned_for: tuple[int, int] | None = None
        self._loss_logs: list[tuple[str, dict[str, Any]]] = []
        self._in_plan = False
        self._kept_grads: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    def setup(self, trainer: pl.Trainer) -> None:
        devices = len(getattr(trainer._accelerator_connector, "_parallel_devices", None) or [None])
        if devices > 1 or trainer.num_nodes > 1:
            raise ValueError(f"PlanStrategy trains on one device (the Trainer asks for {devices} devices on "
                             f"{trainer.num_nodes} nodes): use devices=1; several devices (DDP) are not supported")
        super().setup(trainer)

    # --- the three hooks of automatic optimization ----------------------------------------

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """The plan's step on the batch; its loss is what training_step returned."""
        module = self.lightning_module
        if module is None or not module.automatic_optimization:
            raise ValueError("PlanStrategy runs automatic optimization only (the module sets "
                             "automatic_optimization = False): call peakcut.optimize in your training_step instead")
        plan = self._plan(module, args, kwargs)
        k = plan.accumulate
        updates = plan.micro_steps + 1 == k
        if k > 1 and updates == module.trainer.fit_loop._should_accumulate():
            raise ValueError(f"the Trainer {'accumulates' if updates else 'updates'} on this batch but the plan "
                             f"{'updates' if updates else 'accumulates'} (micro-batch {plan.micro_steps + 1} of "
                             f"accumulate_grad_batches={k})")
        loss = plan.step(args[0])
        self._in_plan = True        # Lightning's backward and optimizer step come next: no-ops
        if k > 1:
            loss = loss * k         # training_step's loss; Lightning divides it by k as the plan's loss_fn did
            if plan.micro_steps == 1:     # Lightning clears the gradients after this window's first training_step
                self._kept_grads = [(p, p.grad) for p in module.parameters()]
        for name, options in self._loss_logs:
            module.log(name, loss, **options)
        return loss

    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Nothing after a plan's step (it ran the backward; the gradients a plan accumulates
        are put back after Lightning's zero_grad); otherwise Lightning's backward."""
        if self._in_plan:
            for p, grad in self._kept_grads:
                p.grad = grad
            self._kept_grads, self._in_plan = [], False
            return closure_loss
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None, **kwargs: Any) -> Any:
        """The closure (training_step: the plan's whole step) and nothing else: the plan clipped,
        updated and cleared the gradients."""
        try:
            return closure()
        finally:
            self._in_plan = False

    # --- planning --------------------------------------------------------------------------

    def _plan(self, module: pl.LightningModule, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Plan:
        optimizers = self.optimizers
        if len(optimizers) != 1:
            raise ValueError(f"PlanStrategy needs exactly one optimizer from configure_optimizers, got {len(optimizers)}")
        opt = optimizers[0]
        key = (id(module), id(opt))        # the plan holds both: their ids are not reused while it lives
        if self.plan is not None and self._planned_for == key:
            return self.plan
        trainer = module.trainer
        self._check(module, trainer)
        clip = trainer.gradient_clip_val
        logs: list[tuple[str, Any, dict[str, Any]]] = []
        returned: list[Any] = []
        k = int(trainer.accumulate_grad_batches)
        loss_fn = _TrainingStepLoss(self.precision_plugin, args[1:], kwargs, returned, k)
        scaler = getattr(self.precision_plugin, "scaler", None)
        # self.log during capture: recorded (the values are traced tensors), not logged
        module.log = _recorder(logs)  # type: ignore[method-assign, unused-ignore]
        try:
            self.plan = optimize(module, args[0], loss_fn, opt, max_grad_norm=float(clip) if clip else None,
                                 scaler=scaler, accumulate=k, **self.peakcut_options)
        finally:
            del module.log
        self._planned_for = key
        loss_ids = {id(r) for r in returned}
        self._loss_logs = list({n: o for n, v, o in logs if id(v) in loss_ids}.items())
        others = sorted({n for n, v, _ in logs if id(v) not in loss_ids})
        if others:
            warnings.warn(f"peakcut: training_step logs {', '.join(others)}, which the plan does not compute at "
                          "each step (training_step's code runs when the step is planned); log them in "
                          "on_train_batch_end or validation instead", stacklevel=2)
        return self.plan

    def _check(self, module: pl.LightningModule, trainer: pl.Trainer) -> None:
        """Refuse what a plan's step cannot do as the Trainer would."""
        k, batches = trainer.accumulate_grad_batches, trainer.num_training_batches
        if k > 1 and batches != float("inf") and int(batches) % k:
            raise ValueError(f"accumulate_grad_batches={k} with {int(batches)} batches per epoch: the Trainer "
                             "updates after fewer micro-batches at the end of each epoch, a plan after "
                             f"{k} always; use a number of batches per epoch divisible by {k}")
        algorithm = trainer.gradient_clip_algorithm or "norm"       # None: Lightning's default, by norm
        if trainer.gradient_clip_val and algorithm != "norm":
            raise ValueError(f"gradient_clip_algorithm={str(algorithm)!r}: PlanStrategy clips by "
                             "norm only (gradient_clip_algorithm='norm')")
        plugin = self.precision_plugin
        if type(plugin) is not Precision and not isinstance(plugin, MixedPrecision):
            raise ValueError(f"precision plugin {type(plugin).__name__}: PlanStrategy supports precision "
                             "'32-true', 'bf16-mixed' and '16-mixed'")
        overridden = [h for h in REFUSED_HOOKS
                      if getattr(type(module), h, None) is not getattr(pl.LightningModule, h, None)]
        if overridden:
            raise ValueError(f"{type(module).__name__} overrides {', '.join(overridden)}: a plan runs the backward, "
                             "clipping and update as one step, so these hooks would not run; remove them "
                             "(clip with the Trainer's gradient_clip_val)")
        callbacks = trainer.callbacks  # type: ignore[attr-defined, unused-ignore]
        hooked = sorted({type(c).__name__ for c in callbacks for h in REFUSED_HOOKS[1:4]
                         if getattr(type(c), h, None) is not getattr(pl.Callback, h, None)})
        if hooked:
            warnings.warn(f"peakcut: callbacks {', '.join(hooked)} hook the backward or the optimizer step, which "
                          "run inside the plan: those hooks are not called", stacklevel=3)


class _TrainingStepLoss:
    """loss_fn(model, batch) for peakcut: the module's training_step under the precision
    plugin's autocast; its loss tensor (or its dict's 'loss'), divided by `k` (Lightning's
    accumulate_grad_batches) as Lightning divides it before the backward."""

    def __init__(self, plugin: Any, rest: tuple[Any, ...], kwargs: dict[str, Any], returned: list[Any],
                 k: int) -> None:
        self.plugin, self.rest, self.kwargs, self.returned, self.k = plugin, rest, kwargs, returned, k

    def __call__(self, model: Any, batch: Any) -> torch.Tensor:
        with self.plugin.train_step_context():
            out = model.training_step(batch, *self.rest, **self.kwargs)
        if isinstance(out, Mapping):
            extra = sorted(k for k in out if k != "loss")
            if extra:
                raise ValueError(f"training_step returns {extra} beside 'loss': a plan returns the loss only")
            out = out.get("loss")
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"training_step must return the loss tensor (or {{'loss': loss}}), got "
                             f"{type(out).__name__}")
        self.returned.append(out)
        return out / self.k if self.k > 1 else out


def _recorder(logs: list[tuple[str, Any, dict[str, Any]]]) -> Callable[..., None]:
    def log(name: str, value: Any, **options: Any) -> None:
        logs.append((name, value, options))
    return log
