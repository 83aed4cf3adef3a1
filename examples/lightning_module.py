"""A LightningModule trained through a peakcut plan: the one change is the Trainer's strategy.

A small MLP with AdamW and a per-step schedule from configure_optimizers trains with the
Trainer's gradient clipping and bf16-mixed precision, first with `PlanStrategy` (the step
found by peakcut on the first batch), then with Lightning's own strategy from the same
weights, and the losses are printed side by side.

    python examples/lightning_module.py           # 10 steps, ~9 s of CPU time
"""

from __future__ import annotations

import argparse
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from peakcut.integrations.lightning import PlanStrategy


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4))
        self.losses: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)     # the loss is logged at every step, through the plan too
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.losses.append(outputs["loss"].item())

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2, weight_decay=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def train(steps: int, use_peakcut: bool) -> list[float]:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(16 * steps, 32, generator=g), torch.randint(0, 4, (16 * steps,), generator=g))
    torch.manual_seed(0)
    module = Classifier()
    strategy: Any = "auto"
    if use_peakcut:     # the one change: a plan for the step, found on the first batch
        strategy = PlanStrategy(peakcut=dict(device="cpu", time_budget=5, max_states=8))
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, strategy=strategy, precision="bf16-mixed",
                        gradient_clip_val=1.0, enable_progress_bar=False, logger=False, enable_model_summary=False,
                        enable_checkpointing=False)
    trainer.fit(module, DataLoader(data, batch_size=16))
    return module.losses


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    losses, reference = train(args.steps, True), train(args.steps, False)
    for k, (a, b) in enumerate(zip(losses, reference, strict=True)):
        print(f"step {k + 1:2d}  peakcut {a:.5f}  lightning {b:.5f}")
    return {"losses": losses, "lightning_losses": reference}


if __name__ == "__main__":
    main()
