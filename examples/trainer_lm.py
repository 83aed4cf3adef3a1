"""Fine-tune a causal LM with the transformers Trainer, its steps through a peakcut plan.

The one change to a Trainer script is the import (and, if you like, the search's settings):

    from peakcut.integrations.transformers import Trainer      # was: from transformers import Trainer
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      peakcut=dict(memory_limit=0.75, device="cpu", time_budget=10))

Everything else is the Trainer's: its default optimizer (fused AdamW, weight decay on the
weight matrices), the cosine schedule with warm-up, clipping at max_grad_norm, gradient
accumulation, bf16 autocast, logging (loss and grad_norm), evaluation and checkpoints. The
first batch is planned (a search of at most --time-budget seconds), and every step then runs
the plan. A small Llama with random weights trains on counting sequences (no downloads).

    python examples/trainer_lm.py                  # 20 steps on a CPU
    python examples/trainer_lm.py --steps 4 --max-states 4
"""

from __future__ import annotations

import argparse
import tempfile

import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainingArguments

from peakcut.integrations.transformers import Trainer

VOCAB, SEQ = 128, 32


class CountingData(torch.utils.data.Dataset):
    """Sequences that count up from a random start by a random stride (mod VOCAB)."""

    def __init__(self, n: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=gen)
        stride = torch.randint(1, 8, (n, 1), generator=gen)
        self.ids = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv: list[str] | None = None) -> Trainer:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    parser.add_argument("--time-budget", type=float, default=10.0, help="seconds for the plan's search")
    parser.add_argument("--max-states", type=int, default=32, help="states for the plan's search")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=SEQ, attn_implementation="eager"))
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out, max_steps=args.steps, per_device_train_batch_size=8, gradient_accumulation_steps=2,
            learning_rate=3e-3, weight_decay=0.1, lr_scheduler_type="cosine", warmup_steps=2, max_grad_norm=1.0,
            bf16=True, logging_steps=max(1, args.steps // 4), eval_strategy="steps", eval_steps=args.steps,
            save_steps=args.steps, report_to=[], dataloader_num_workers=0, seed=0, disable_tqdm=True,
            use_cpu=not torch.cuda.is_available())
        trainer = Trainer(model=model, args=training, train_dataset=CountingData(512),
                          eval_dataset=CountingData(32, seed=1),
                          peakcut=dict(memory_limit=0.75, device="cpu", time_budget=args.time_budget,
                                       max_states=args.max_states))
        trainer.train()
    plan = trainer.peakcut_plan
    if plan is not None:
        print(f"{plan!r}")
        for change in plan.report.get("recipes", []) + plan.report.get("rewrites", []):
            print(f"  {change}")
    for reason in trainer.peakcut_fallbacks:
        print(f"transformers' own step was used: {reason}")
    return trainer


if __name__ == "__main__":
    main()
