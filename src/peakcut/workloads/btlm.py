"""BTLM-3B-8K (Cerebras, Dey et al. 2023, arXiv:2309.11568), defined in-project.

Sources: the paper, the ``cerebras/btlm-3b-8k-base`` model card and config (``model_type``
``btlm``, loaded with ``trust_remote_code``), and the public ports of its modelling code
(e.g. text-generation-inference's ``BTLMForCausalLM``, flash-attn's ``btlm`` state-dict remap).

Architecture (GPT-2 style, pre-LayerNorm decoder):

* 32 layers, ``d_model`` 2560, 32 heads (head dim 80), vocab 50257, LayerNorm eps 1e-5;
  every linear layer has a bias.
* No position embeddings; ALiBi bias ``-slope_h * |i - j|`` added to the attention scores,
  with the standard power-of-two slopes, stored as a (non-trainable) buffer.
* SwiGLU MLP with inner size 6826: ``c_proj(c_fc(x) * silu(c_fc2(x)))``.
* muP: input embeddings scaled by 14.6 (``mup_embeddings_scale``), attention scores scaled by
  ``1 / head_dim`` instead of ``1 / sqrt(head_dim)`` (``mup_scale_qk_dot_by_d``), output
  logits scaled by ``mup_output_alpha * mup_width_scale`` = 2.22 * 0.1.
* LM head tied to the token embedding (the published checkpoint stores one matrix; this gives
  the published 2.6B parameter count: 2,646,255,744 here; an untied head would be 2.77B).
* All dropout probabilities 0 (as published).

Assumptions: the muP multipliers above are from the published config as recalled by the
authors of this module (they only scale activations and do not change shapes or memory);
attention softmax runs in the activation dtype (the reference code does not upcast); the
causal and padding masks are built inside ``forward`` rather than kept as an ``n_positions``
square buffer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from peakcut.workloads.hf import shifted_lm_loss

Batch = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class BTLMConfig:
    """Hyper-parameters of a BTLM decoder."""

    vocab_size: int = 50257
    d_model: int = 2560
    n_layer: int = 32
    n_head: int = 32
    n_inner: int = 6826
    layer_norm_epsilon: float = 1e-5
    embeddings_scale: float = 14.6
    output_alpha: float = 2.22
    width_scale: float = 0.1
    dropout: float = 0.0
    tie_word_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


PAPER = BTLMConfig()
MEDIUM = BTLMConfig(n_layer=2)   # the paper's widths and vocabulary, 2 of its 32 layers
TINY = BTLMConfig(vocab_size=256, d_model=64, n_layer=2, n_head=4, n_inner=170)
CONFIGS = {"paper": PAPER, "medium": MEDIUM, "tiny": TINY}
SEQ = {"paper": 512, "medium": 128, "tiny": 32}


def alibi_slopes(n_head: int) -> list[float]:
    """ALiBi head slopes (Press et al. 2022), including the non-power-of-two rule."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start ** (i + 1) for i in range(n)]

    if math.log2(n_head).is_integer():
        return power_of_2(n_head)
    closest = 2 ** math.floor(math.log2(n_head))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n_head - closest]


class BTLMAttention(nn.Module):
    """Multi-head self-attention with muP 1/d scaling; ALiBi and masks come from the caller."""

    def __init__(self, cfg: BTLMConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.head_dim = cfg.head_dim
        self.c_attn = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.c_proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, alibi: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, self.head_dim).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / float(self.head_dim)
        probs = F.softmax(scores + alibi + mask, dim=-1)
        out = torch.matmul(self.attn_dropout(probs), v)
        out = out.transpose(1, 2).reshape(b, t, d)
        return self.resid_dropout(self.c_proj(out))


class BTLMMLP(nn.Module):
    """SwiGLU feed-forward: ``c_proj(c_fc(x) * silu(c_fc2(x)))``."""

    def __init__(self, cfg: BTLMConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.d_model, cfg.n_inner)
        self.c_fc2 = nn.Linear(cfg.d_model, cfg.n_inner)
        self.c_proj = nn.Linear(cfg.n_inner, cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.c_fc(x) * F.silu(self.c_fc2(x))))


class BTLMBlock(nn.Module):
    """Pre-LayerNorm decoder block."""

    def __init__(self, cfg: BTLMConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon)
        self.attn = BTLMAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon)
        self.mlp = BTLMMLP(cfg)

    def forward(self, x: torch.Tensor, alibi: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), alibi, mask)
        return x + self.mlp(self.ln_2(x))


class BTLMModel(nn.Module):
    """Token embedding, ALiBi decoder stack and final LayerNorm."""

    alibi_slopes: torch.Tensor  # a registered buffer

    def __init__(self, cfg: BTLMConfig) -> None:
        super().__init__()
        self.embeddings_scale = cfg.embeddings_scale
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(BTLMBlock(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_epsilon)
        self.register_buffer("alibi_slopes", torch.tensor(alibi_slopes(cfg.n_head)))

    def attention_bias(
        self, attention_mask: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """ALiBi bias (1, H, T, T) and additive causal+padding mask (B, 1, T, T)."""
        t = attention_mask.shape[1]
        pos = torch.arange(t, device=attention_mask.device)
        distance = (pos[None, :] - pos[:, None]).abs().to(dtype)  # (T, T): |j - i|
        alibi = -self.alibi_slopes.to(dtype)[None, :, None, None] * distance
        causal = pos[None, :] <= pos[:, None]  # (T, T): key j visible from query i
        keep = causal[None, None] & attention_mask[:, None, None, :].bool()
        zero = torch.zeros((), dtype=dtype, device=attention_mask.device)
        mask = torch.where(keep, zero, torch.finfo(dtype).min)
        return alibi, mask

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(input_ids) * self.embeddings_scale)
        alibi, mask = self.attention_bias(attention_mask, x.dtype)
        for block in self.h:
            x = block(x, alibi, mask)
        return self.ln_f(x)


class BTLMForCausalLM(nn.Module):
    """BTLM decoder with a (tied) muP-scaled LM head; returns logits (B, T, V)."""

    def __init__(self, cfg: BTLMConfig) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = BTLMModel(cfg)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.transformer.wte.weight
        self.output_logits_scale = cfg.output_alpha * cfg.width_scale
        self.apply(_init_weights)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.transformer(input_ids, attention_mask)
        return self.lm_head(hidden) * self.output_logits_scale


def _init_weights(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2 style init: normal(0, std) weights, zero biases (LayerNorm keeps 1 and 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=std)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def make_btlm_3b(size: str, batch_size: int) -> tuple[nn.Module, Batch]:
    """BTLM-3B-8K (or its tiny sibling) and ``(input_ids, attention_mask, labels)``."""
    cfg = CONFIGS[size]
    seq = SEQ[size]
    model = BTLMForCausalLM(cfg)
    input_ids = torch.randint(0, cfg.vocab_size, (batch_size, seq))
    attention_mask = torch.ones(batch_size, seq, dtype=torch.long)
    return model, (input_ids, attention_mask, input_ids.clone())


def btlm_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Next-token cross-entropy of the BTLM logits."""
    input_ids, attention_mask, labels = batch
    return shifted_lm_loss(model(input_ids, attention_mask), labels)
