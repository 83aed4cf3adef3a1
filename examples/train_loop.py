"""A complete training loop with peakcut: copy it and put your own model and data in.

A small Llama-style causal LM (random weights, no downloads) is trained for `--steps`
steps with what a real loop has:

- AdamW in two param groups (weight decay 0.1 on matrices, 0.0 on biases and norms),
- a warm-up + cosine LambdaLR schedule,
- gradient clipping at 1.0 and bf16 autocast inside loss_fn,
- a checkpoint at step 10 (model + optimizer + scheduler state_dicts), and a resume
  from it into a fresh model, optimizer, scheduler and plan.

`peakcut.optimize` captures one training step (forward, loss, backward, clipping and the
AdamW update), searches memory-saving rewrites of it and returns a plan; `plan.step(batch)`
then replaces `loss.backward(); clip_grad_norm_(...); opt.step(); opt.zero_grad()`. The
plan reads `opt.param_groups` at every step (so the scheduler works as usual) and keeps
the AdamW moments in `opt.state` (so `opt.state_dict()` checkpoints work as usual).

At the end the same loop runs eagerly from the same initial weights, and the resumed run
is compared with it (see `relative_difference`).

    python examples/train_loop.py                   # 20 steps, ~15 s search per plan
    python examples/train_loop.py --steps 12 --time-budget 8
"""

from __future__ import annotations

import argparse
import copy
import math
import tempfile
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

import peakcut

VOCAB, SEQ, BATCH = 256, 64, 8
LR, WARMUP, CHECKPOINT_AT, LOG_EVERY = 3e-3, 4, 10, 5


# --- model, data, loss -------------------------------------------------------------------

def build_model() -> nn.Module:
    """A 2-layer Llama (RMSNorm, RoPE, SwiGLU) with hidden size 64 and random weights."""
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                         attn_implementation="eager")
    return LlamaForCausalLM(config).train()


def make_batches(steps: int, seed: int = 0) -> list[tuple[torch.Tensor]]:
    """`steps` batches of token ids, each a tuple (input_ids,) of shape BATCH x SEQ.

    Every sequence counts up from a random start by a random stride (mod VOCAB), so there is
    something to learn and the loss goes down."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        start = torch.randint(0, VOCAB, (BATCH, 1), generator=gen)
        stride = torch.randint(1, 8, (BATCH, 1), generator=gen)
        batches.append(((start + stride * torch.arange(SEQ)) % VOCAB,))
    return batches


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor]) -> torch.Tensor:
    """loss_fn(model, batch) -> scalar loss: the model's own next-token cross-entropy, in bf16."""
    (input_ids,) = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(input_ids=input_ids, labels=input_ids).loss


# --- optimizer and schedule --------------------------------------------------------------

def make_optimizer(model: nn.Module, steps: int) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    decay = [p for p in model.parameters() if p.dim() >= 2]       # weight matrices, embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]     # biases and norm weights
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95))

    def warmup_cosine(step: int) -> float:
        if step < WARMUP:
            return (step + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / max(1, steps - WARMUP)))

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)


# --- peakcut -----------------------------------------------------------------------------

def make_plan(model: nn.Module, batch: tuple[torch.Tensor], opt: torch.optim.Optimizer,
              time_budget: float, max_states: int | None) -> peakcut.Plan:
    """The fastest step found that peaks at <= 60% of eager's memory (CPU cost model).

    The search stops at `time_budget` seconds or `max_states` states, whichever comes first;
    the same seed (default 0) gives the same plan when it stops on max_states."""
    try:
        plan = peakcut.optimize(model, batch, loss_fn, optimizer=opt, max_grad_norm=1.0,
                                memory_limit=0.6, time_budget=time_budget, max_states=max_states,
                                device="cpu")
    except peakcut.LimitNotMet as err:
        print(f"  memory limit not met, using the best plan found: {err}")
        plan = err.plan
    report = plan.report
    print(f"  {plan!r}")
    print(f"  peak {report['peak_bytes']:,} B (eager {report['eager_peak_bytes']:,} B), "
          f"{len(report['applied'])} rewrites applied, step {report['step']}")
    return plan


def train(model: nn.Module, opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR,
          batches: list[tuple[torch.Tensor]], start: int, stop: int, plan: peakcut.Plan | None,
          checkpoint: Path | None = None) -> list[float]:
    """Steps start..stop-1: through `plan`, or eagerly when plan is None. Returns the losses."""
    losses = []
    for step in range(start, stop):
        batch = batches[step]
        if plan is not None:
            loss = plan.step(batch)         # forward, backward, clip, AdamW update, zero_grad
        else:
            loss = loss_fn(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        lr = sched.get_last_lr()[0]         # the learning rate this step used
        sched.step()
        losses.append(loss.item())
        if (step + 1) % LOG_EVERY == 0 or step + 1 == stop:
            print(f"  step {step + 1:3d}  loss {losses[-1]:.4f}  lr {lr:.2e}")
        if checkpoint is not None and step + 1 == CHECKPOINT_AT:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()},
                       checkpoint)
            print(f"  saved checkpoint at step {step + 1}")
    return losses


def relative_difference(model: nn.Module, eager: nn.Module, initial: dict[str, torch.Tensor]) -> float:
    """||p - p_eager|| / ||p_eager - p_0|| over all parameters together.

    bf16 autocast rounds each matmul to ~3 significant digits, and a plan that splits or
    re-orders a reduction rounds differently. AdamW turns any gradient into an update of
    about lr, so a parameter whose gradient is only rounding noise moves by noise, in eager
    too; parameters are therefore compared together, relative to how far training moved them."""
    num = den = 0.0
    for (name, p), (_, q) in zip(model.named_parameters(), eager.named_parameters(), strict=True):
        num += float(((p.detach() - q.detach()).double() ** 2).sum())
        den += float(((q.detach() - initial[name]).double() ** 2).sum())
    return math.sqrt(num / den)


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    parser.add_argument("--time-budget", type=float, default=15.0, help="seconds per peakcut search")
    parser.add_argument("--max-states", type=int, default=64, help="states per peakcut search")
    args = parser.parse_args(argv)
    if args.steps <= CHECKPOINT_AT:
        parser.error(f"--steps must be > {CHECKPOINT_AT} (the checkpoint step)")

    torch.manual_seed(0)
    model = build_model()
    initial_state = copy.deepcopy(model.state_dict())
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    batches = make_batches(args.steps)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.pt"

        print(f"Training steps 1-{CHECKPOINT_AT} with a peakcut plan:")
        opt, sched = make_optimizer(model, args.steps)
        plan = make_plan(model, batches[0], opt, args.time_budget, args.max_states)
        losses = train(model, opt, sched, batches, 0, CHECKPOINT_AT, plan, checkpoint=path)

        print(f"Resuming from the checkpoint: steps {CHECKPOINT_AT + 1}-{args.steps} "
              "with a fresh model, optimizer, scheduler and plan:")
        resumed = build_model()                    # other random weights until the checkpoint loads
        opt, sched = make_optimizer(resumed, args.steps)
        state = torch.load(path)
        resumed.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        plan = make_plan(resumed, batches[0], opt, args.time_budget, args.max_states)
        losses += train(resumed, opt, sched, batches, CHECKPOINT_AT, args.steps, plan)

    print(f"Check: the same {args.steps} steps eagerly, from the same initial weights:")
    eager = build_model()
    eager.load_state_dict(initial_state)
    opt, sched = make_optimizer(eager, args.steps)
    eager_losses = train(eager, opt, sched, batches, 0, args.steps, plan=None)

    diff = relative_difference(resumed, eager, initial)
    worst_loss = max(abs(a - b) for a, b in zip(losses, eager_losses, strict=True))
    print(f"Resumed peakcut run vs eager: ||p - p_eager|| / ||p_eager - p_0|| = {diff:.2e}; "
          f"max |loss - loss_eager| = {worst_loss:.2e}")
    return {"losses": losses, "eager_losses": eager_losses, "param_diff": diff, "report": plan.report,
            "model": resumed, "eager": eager, "initial": initial}


if __name__ == "__main__":
    main()
