"""peakcut inside the training frameworks people already use.

Each file adapts one framework and imports it only when used; a framework that is not
installed raises an ImportError that names the extra to install.

- accelerate.py: optimize(accelerator, model, batch, loss_fn, optimizer) for what
  `accelerator.prepare` returned (one process; its mixed precision and gradient accumulation);
- lightning.py: PlanStrategy, a single-device Lightning Strategy whose training step is a plan;
- transformers.py: Trainer, transformers' Trainer whose training steps run a plan (the
  optimizer, schedule, clipping and its logged grad_norm, accumulation, mixed precision,
  checkpoints as the Trainer sets them; its own step, with a warning, where a plan cannot run);
- transformers_settings.py: the Trainer's `peakcut=` settings, and the Trainer setups a plan
  cannot run, by name.
"""
