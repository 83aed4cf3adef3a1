"""Hugging Face ``transformers`` workloads: BERT-base MLM, ViT-base/16, GPT-Neo-1.3B.

Models are built from configs with random weights (nothing is downloaded). All use the eager
attention implementation, so the T x T attention scores are explicit ops, have every dropout
probability set to 0 and ``use_cache=False``. Losses are computed here from the returned
logits with ``torch.nn.functional.cross_entropy`` (not via the models' ``labels=`` argument).

Paper configs reproduce the published checkpoints' ``config.json``:
``bert-base-uncased`` (109.5M parameters with the tied MLM head),
``google/vit-base-patch16-224`` (86.6M) and ``EleutherAI/gpt-neo-1.3B`` (1.316B, tied LM head,
alternating global/local attention with window 256).

``transformers`` is imported when a model is built (:func:`transformers_module`), so the
other workloads and the rest of peakcut work without it; building one of these without it
raises an ImportError that names the extra to install (``peakcut[workloads]``).
"""

from __future__ import annotations

import copy
import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from transformers import BertConfig, GPTNeoConfig, ViTConfig

Batch = tuple[torch.Tensor, ...]

# Config keyword arguments are heterogeneous (ints, strings, nested lists): typed as Any here,
# checked by the transformers config classes themselves.
_COMMON: dict[str, Any] = {"attn_implementation": "eager", "use_cache": False}
_MASK_PROB = 0.15
_IGNORE = -100


_BERT_DIMS: dict[str, dict[str, Any]] = {
    "paper": {
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "max_position_embeddings": 512,
    },
    "tiny": {
        "vocab_size": 256,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "max_position_embeddings": 64,
    },
}
_BERT_DIMS["medium"] = _BERT_DIMS["paper"]      # the paper network at a smaller batch and sequence

_VIT_DIMS: dict[str, dict[str, Any]] = {
    "paper": {
        "image_size": 224,
        "patch_size": 16,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "num_labels": 1000,
    },
    "tiny": {
        "image_size": 32,
        "patch_size": 8,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "num_labels": 10,
    },
}
_VIT_DIMS["medium"] = _VIT_DIMS["paper"]        # the paper network at a smaller batch

_GPT_NEO_DIMS: dict[str, dict[str, Any]] = {
    "paper": {
        "vocab_size": 50257,
        "hidden_size": 2048,
        "num_layers": 24,
        "num_heads": 16,
        "max_position_embeddings": 2048,
        "window_size": 256,
        "attention_types": [[["global", "local"], 12]],
        "bos_token_id": 50256,
        "eos_token_id": 50256,
    },
    "tiny": {
        "vocab_size": 256,
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 4,
        "max_position_embeddings": 64,
        "window_size": 8,
        "attention_types": [[["global", "local"], 1]],
        "bos_token_id": 255,
        "eos_token_id": 255,
    },
}


_GPT_NEO_DIMS["medium"] = {**_GPT_NEO_DIMS["paper"], "num_layers": 2,
                           "attention_types": [[["global", "local"], 1]]}
"""The paper's widths and vocabulary, 2 of its 24 layers (one global, one local)."""
_BERT_SEQ = {"paper": 512, "medium": 128, "tiny": 32}
_GPT_NEO_SEQ = {"paper": 512, "medium": 128, "tiny": 32}


def transformers_module() -> ModuleType:
    """The ``transformers`` package; an ImportError naming the extra when it is not installed."""
    try:
        return importlib.import_module("transformers")
    except ModuleNotFoundError as e:
        if e.name != "transformers":
            raise
        raise ImportError("the transformers workloads (bert-base, vit-base, gpt-neo-1.3b, llama2-7b, "
                          "gpt2-xl) need transformers: pip install 'peakcut[workloads]'") from e


def bert_config(size: str) -> BertConfig:
    """``bert-base-uncased`` (paper) or a 2-layer, 64-wide sibling (tiny)."""
    return transformers_module().BertConfig(
        **_BERT_DIMS[size], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_COMMON
    )


def vit_config(size: str) -> ViTConfig:
    """``google/vit-base-patch16-224`` with 1000 classes (paper) or a 32x32/patch-8 sibling."""
    return transformers_module().ViTConfig(
        **_VIT_DIMS[size], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **_COMMON
    )


def gpt_neo_config(size: str) -> GPTNeoConfig:
    """``EleutherAI/gpt-neo-1.3B`` (paper) or a 2-layer global+local sibling (tiny)."""
    return transformers_module().GPTNeoConfig(
        **copy.deepcopy(_GPT_NEO_DIMS[size]),
        intermediate_size=None,  # 4 * hidden_size
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        embed_dropout=0.0,
        attention_dropout=0.0,
        resid_dropout=0.0,
        tie_word_embeddings=True,
        **_COMMON,
    )


def _token_batch(vocab_size: int, batch_size: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    input_ids = torch.randint(0, vocab_size, (batch_size, seq))
    attention_mask = torch.ones(batch_size, seq, dtype=torch.long)
    return input_ids, attention_mask


def make_bert_base(size: str, batch_size: int) -> tuple[nn.Module, Batch]:
    """BertForMaskedLM and ``(input_ids, attention_mask, labels)``.

    15% of positions are masked: their input id becomes ``[MASK]`` and their label is the
    original token; all other labels are -100 (ignored). Position 0 is always masked so that
    the loss is defined for any seed.
    """
    cfg = bert_config(size)
    model = transformers_module().BertForMaskedLM(cfg)
    tokens, attention_mask = _token_batch(cfg.vocab_size, batch_size, _BERT_SEQ[size])
    masked = torch.rand(tokens.shape) < _MASK_PROB
    masked[:, 0] = True
    mask_id = 103 if size != "tiny" else cfg.vocab_size - 1  # [MASK] in bert-base-uncased
    input_ids = torch.where(masked, torch.full_like(tokens, mask_id), tokens)
    labels = torch.where(masked, tokens, torch.full_like(tokens, _IGNORE))
    return model, (input_ids, attention_mask, labels)


def make_vit_base(size: str, batch_size: int) -> tuple[nn.Module, Batch]:
    """ViTForImageClassification and ``(pixel_values, labels)``."""
    cfg = vit_config(size)
    model = transformers_module().ViTForImageClassification(cfg)
    side: int = _VIT_DIMS[size]["image_size"]  # the config's field also admits a (h, w) pair
    classes: int = _VIT_DIMS[size]["num_labels"]
    pixels = torch.randn(batch_size, cfg.num_channels, side, side)
    labels = torch.randint(0, classes, (batch_size,))
    return model, (pixels, labels)


def make_gpt_neo_1_3b(size: str, batch_size: int) -> tuple[nn.Module, Batch]:
    """GPTNeoForCausalLM and ``(input_ids, attention_mask, labels)`` (labels = input_ids)."""
    cfg = gpt_neo_config(size)
    model = transformers_module().GPTNeoForCausalLM(cfg)
    input_ids, attention_mask = _token_batch(cfg.vocab_size, batch_size, _GPT_NEO_SEQ[size])
    return model, (input_ids, attention_mask, input_ids.clone())


def masked_lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Cross-entropy over the vocabulary at masked positions (labels != -100)."""
    input_ids, attention_mask, labels = batch
    logits = model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).logits
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=_IGNORE
    )


def image_classification_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Cross-entropy of the classifier logits against integer labels."""
    pixel_values, labels = batch
    logits = model(pixel_values=pixel_values, return_dict=True).logits
    return F.cross_entropy(logits, labels)


def shifted_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: position t predicts ``labels[:, t + 1]``.

    Logits are upcast to fp32 first, as transformers' own causal-LM loss does.
    """
    shift_logits = logits[:, :-1, :].float()
    shift_labels = labels[:, 1:]
    return F.cross_entropy(
        shift_logits.reshape(-1, shift_logits.size(-1)),
        shift_labels.reshape(-1),
        ignore_index=_IGNORE,
    )


def causal_lm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Causal language-modelling loss of an HF ``*ForCausalLM`` model."""
    input_ids, attention_mask, labels = batch
    logits = model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True).logits
    return shifted_lm_loss(logits, labels)
