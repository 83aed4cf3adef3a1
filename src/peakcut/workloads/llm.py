"""Full-size LLM workloads beyond the paper's table: Llama-2-7B and GPT-2-XL causal LM, ``transformers`` models.

Built from configs with random weights (nothing is downloaded), like :mod:`.hf`: eager attention
(the T x T scores are explicit ops), every dropout probability 0, ``use_cache=False``; the loss
is :func:`peakcut.workloads.hf.causal_lm_loss` (next-token cross-entropy on fp32 logits).

Paper configs reproduce the published checkpoints' ``config.json``:

* ``meta-llama/Llama-2-7b-hf``: ``LlamaForCausalLM``, vocab 32000, hidden 4096, intermediate
  11008 (SwiGLU), 32 layers, 32 heads with 32 key/value heads (no GQA), RoPE (theta 10000),
  RMSNorm eps 1e-5, untied LM head, ``max_position_embeddings`` 4096: 6,738,415,616 parameters.
  Batch 8 x seq 2048, bf16 weights.
* ``gpt2-xl``: ``GPT2LMHeadModel``, 48 layers, ``n_embd`` 1600, 25 heads, vocab 50257,
  ``n_positions`` 1024, ``gelu_new``, LM head tied to the token embedding: 1,557,611,200
  parameters. Batch 16 x seq 1024, fp32.

Optimizer state: peakcut captures the update of ``torch.optim`` (``spec.optimizers``), whose
Adam/AdamW state slots are ``zeros_like(param)`` (``capture.training_step`` makes them the same
way), so over bf16 Llama weights the captured ``exp_avg`` / ``exp_avg_sq`` are **bf16**, not the
fp32 moments of a mixed-precision recipe: the paper-size llama2-7b step holds 3 x 13.5 GB of
weights and moments, not 13.5 + 2 x 27 GB. No mixed-precision optimizer is modelled here.

Medium sizes (the paper architecture scaled so that one real fp32 eager AdamW step on a 2-core
CPU takes seconds and holds a few GB, see :mod:`.base`), both at batch 1 x seq 128, fp32:

* llama2-7b: the paper's decoder widths (hidden 4096, intermediate 11008, 32 heads of 128) but
  **1** of its 32 layers and a vocabulary shrunk from 32000 to 8000 (267.9M parameters): even
  one paper-width layer with the 32000 vocabulary is 464M parameters, 7.4 GB with gradients and
  AdamW moments. Its step takes about 4 s, like btlm-3b's medium, and could not be made much
  faster without narrowing the layer: 202M of the parameters are that one layer.
* gpt2-xl: the paper's widths and vocabulary, 2 of its 48 layers (143.5M parameters).

Measured with ``python -m bench.medium_sizes gpt-neo-1.3b llama2-7b gpt2-xl`` (2-core AMD EPYC,
torch 2.13 CPU, the machine shared: load average 2; gpt-neo-1.3b took 3.75 s in the same run):
eager step median (min-max) of 3, held / peak GiB:
llama2-7b 4.63 s (3.24-4.69), 2.99 / 4.50 GiB; gpt2-xl 1.80 s (1.73-2.01), 1.60 / 2.74 GiB.

``tiny``: 2 layers, hidden 64, 4 heads, vocab 256, seq 32, batch 4, fp32.

:func:`gpt2_xl_config` / :func:`llama2_7b_config` take an ``n_layer`` override, and
:func:`peakcut.workloads.base.deepened_gpt2_xl` builds GPT-2-XL with more layers (e.g. 96) on the meta device, for
scale tests of capture and planning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from peakcut.workloads.hf import Batch, _token_batch, transformers_module

if TYPE_CHECKING:
    from transformers import GPT2Config, LlamaConfig

_COMMON: dict[str, Any] = {"attn_implementation": "eager", "use_cache": False}

_LLAMA_DIMS: dict[str, dict[str, Any]] = {
    "paper": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 4096,
    },
    "tiny": {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 172,          # 11008 / 4096 of the width, as in the paper
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "max_position_embeddings": 64,
    },
}
_LLAMA_DIMS["medium"] = {**_LLAMA_DIMS["paper"], "num_hidden_layers": 1, "vocab_size": 8000}
"""The paper's decoder widths, 1 of its 32 layers, vocabulary 8000 (see the module docstring)."""

_GPT2_DIMS: dict[str, dict[str, Any]] = {
    "paper": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 1600, "n_layer": 48, "n_head": 25},
    "tiny": {"vocab_size": 256, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4,
             "bos_token_id": 255, "eos_token_id": 255},
}
_GPT2_DIMS["medium"] = {**_GPT2_DIMS["paper"], "n_layer": 2}
"""The paper's widths and vocabulary, 2 of its 48 layers."""

LLAMA_SEQ = {"paper": 2048, "medium": 128, "tiny": 32}
GPT2_SEQ = {"paper": 1024, "medium": 128, "tiny": 32}


def llama2_7b_config(size: str, n_layer: int | None = None) -> LlamaConfig:
    """``meta-llama/Llama-2-7b-hf`` (paper), its medium or tiny sibling; ``n_layer`` overrides the depth."""
    dims = dict(_LLAMA_DIMS[size])
    if n_layer is not None:
        dims["num_hidden_layers"] = n_layer
    return transformers_module().LlamaConfig(
        **dims,
        hidden_act="silu",
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attention_bias=False,
        mlp_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        **_COMMON,
    )


def gpt2_xl_config(size: str, n_layer: int | None = None) -> GPT2Config:
    """``gpt2-xl`` (paper), its medium or tiny sibling; ``n_layer`` overrides the depth."""
    dims = dict(_GPT2_DIMS[size])
    if n_layer is not None:
        dims["n_layer"] = n_layer
    return transformers_module().GPT2Config(
        **dims,
        n_inner=None,  # 4 * n_embd
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        summary_first_dropout=0.0,
        tie_word_embeddings=True,
        **_COMMON,
    )


def make_llama2_7b(size: str, batch_size: int, n_layer: int | None = None) -> tuple[nn.Module, Batch]:
    """LlamaForCausalLM and ``(input_ids, attention_mask, labels)`` (labels = input_ids)."""
    cfg = llama2_7b_config(size, n_layer)
    model = transformers_module().LlamaForCausalLM(cfg)
    input_ids, attention_mask = _token_batch(cfg.vocab_size, batch_size, LLAMA_SEQ[size])
    return model, (input_ids, attention_mask, input_ids.clone())


def make_gpt2_xl(size: str, batch_size: int, n_layer: int | None = None) -> tuple[nn.Module, Batch]:
    """GPT2LMHeadModel and ``(input_ids, attention_mask, labels)`` (labels = input_ids)."""
    cfg = gpt2_xl_config(size, n_layer)
    model = transformers_module().GPT2LMHeadModel(cfg)
    input_ids, attention_mask = _token_batch(cfg.vocab_size, batch_size, GPT2_SEQ[size])
    return model, (input_ids, attention_mask, input_ids.clone())
