"""An Accelerate training loop through a peakcut plan: one line makes the plan, one line steps it.

A small MLP trains with AdamW, a StepLR schedule, clipping at 1.0 and Accelerate's bf16
mixed precision (autocast on this CPU), first through the plan, then with Accelerate's own
`accelerator.backward` loop from the same weights, and the losses are printed side by side.

    python examples/accelerate_loop.py            # 10 steps, ~8 s of CPU time
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from torch import nn

import peakcut.integrations.accelerate


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def batches(steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 32, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(steps)]


def train(steps: int, use_peakcut: bool) -> list[float]:
    AcceleratorState._reset_state(True)     # two Accelerators in one script: start each afresh
    GradientState._reset_state()
    accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    model, opt, sched = accelerator.prepare(model, opt, sched)
    data = batches(steps)
    plan: Any = None
    if use_peakcut:     # the one new line: a plan for the prepared model and optimizer
        plan = peakcut.integrations.accelerate.optimize(accelerator, model, data[0], loss_fn, opt,
                                                        max_grad_norm=1.0, device="cpu", time_budget=5,
                                                        max_states=8)
    losses = []
    for batch in data:
        if plan is not None:
            loss = plan.step(batch)     # replaces the five lines below
        else:
            loss = loss_fn(model, batch)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        sched.step()
        losses.append(loss.item())
    return losses


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    losses, reference = train(args.steps, True), train(args.steps, False)
    for k, (a, b) in enumerate(zip(losses, reference, strict=True)):
        print(f"step {k + 1:2d}  peakcut {a:.5f}  accelerate {b:.5f}")
    return {"losses": losses, "accelerate_losses": reference}


if __name__ == "__main__":
    main()
