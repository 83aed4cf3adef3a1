"""peakcut's Trainer on a LoRA model from PEFT: transformers' own numbers over 10 steps.

The run of tests/integrations/test_transformers.py (fused AdamW with weight decay, cosine with
warm-up, max_grad_norm=1.0 acting, two micro-batches per update, bf16, an evaluation and a
checkpoint at step 5, and a resume into a fresh Trainer and model) on the tiny Llama with
rank-4 LoRA adapters on the attention's q and v projections: only the adapters train, the
frozen base weights are inputs of the plan. Tolerances and why: that module's docstring.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.integrations.test_transformers import check_same_training, run_pair, tiny_llama

peft = pytest.importorskip("peft")


def lora_llama(seed: int = 0) -> torch.nn.Module:
    """The tiny Llama of seed 0 (the pretrained base, which a checkpoint of adapters does not
    hold) with LoRA adapters drawn from `seed` (alpha 32: the gradients' norm is above the clip)."""
    model = tiny_llama(0)
    torch.manual_seed(seed)
    config = peft.LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights="gaussian")
    return peft.get_peft_model(model, config)


def test_lora_trainer_matches_transformers_trainer(tmp_path: Path) -> None:
    initial = [p.detach().clone() for p in lora_llama(0).parameters() if p.requires_grad]
    eager, first, resumed = run_pair(tmp_path, lora_llama)
    trained = {n for n, p in resumed.model.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    assert resumed.peakcut_plan.report["step"]["param_groups"] == 2
    check_same_training(eager, first, resumed, initial)
