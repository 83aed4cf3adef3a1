"""Tiny models, batches and optimizers the data-parallel tests train on every rank.

Written here, not imported from the workloads: a spawned rank imports only torch and
peakcut, so it starts in seconds.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, SEQ, WIDTH, HEADS = 64, 16, 32, 4


class Block(nn.Module):
    """Pre-norm causal self-attention and an MLP. The qkv projection has no bias: the key's
    bias gets a gradient that is zero but for rounding, which AdamW's normalisation turns into
    updates of order lr, so two exact-in-theory computations of it cannot be compared."""

    def __init__(self) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.ln2 = nn.LayerNorm(WIDTH)
        self.up = nn.Linear(WIDTH, 4 * WIDTH)
        self.down = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (c // HEADS) ** 0.5
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln2(x))))


class TinyGPT(nn.Module):
    """A 2-block GPT-like causal LM with tied embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln = nn.LayerNorm(WIDTH)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.pos[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.embed.weight.t()


def gpt_batch(rank: int, step: int, batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank `rank`'s batch at `step`: token ids and next-token targets."""
    g = torch.Generator().manual_seed(1000 * rank + step)
    ids = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def gpt_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    logits = model(batch[0])
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch[1].reshape(-1))


class TinyCNN(nn.Module):
    """Two conv + BatchNorm blocks and a linear head (BatchNorm buffers: DDP broadcasts them).
    The convolutions have no bias, as usual before a BatchNorm (which cancels it: its gradient
    is zero but for rounding)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def cnn_batch(rank: int, step: int, batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2000 * rank + step)
    return torch.randn(batch, 3, 16, 16, generator=g), torch.randint(0, 12, (batch,), generator=g)


def cnn_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def adamw_two_groups(model: nn.Module, lr: float = 3e-3) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and none on biases, norms and 1-d parameters."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.99))
