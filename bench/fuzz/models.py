"""Random training steps: a model assembled from a vocabulary of real layers, a batch, a
loss and an optimizer, all drawn from one seed.

Two families: sequences (B, T, D), entered by token ids through an embedding or by float
features through a linear layer; images (B, C, H, W), entered through a convolution
(sometimes channels-last). Each block keeps the family's shape, so any sequence of blocks
is a valid model.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import peakcut
from peakcut.capture.optimizers import Recipe


@dataclass
class Case:
    """One random training step."""

    seed: int
    model: nn.Module
    batch: tuple[torch.Tensor, ...]
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    optimizer: Recipe
    dtype: torch.dtype
    description: str


# ---------------------------------------------------------------- sequence blocks (B, T, D)
class LinearAct(nn.Module):
    def __init__(self, d: int, act: str) -> None:
        super().__init__()
        self.fc, self.act = nn.Linear(d, d), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(F, self.act)(self.fc(x))


class ResidualMLP(nn.Module):
    def __init__(self, d: int, act: str) -> None:
        super().__init__()
        self.up, self.down, self.act = nn.Linear(d, 2 * d), nn.Linear(2 * d, d), act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(getattr(F, self.act)(self.up(x)))


class RMSNorm(nn.Module):
    """By hand, as Llama writes it."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, d: int, heads: int, by_hand: bool, causal: bool) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.heads, self.by_hand, self.causal = heads, by_hand, causal

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(x).chunk(3, dim=-1))
        if self.by_hand:
            scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
            if self.causal:
                scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1),
                                            float("-inf"))
            y = scores.softmax(-1) @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return x + self.out(y.transpose(1, 2).reshape(b, t, d))


class MixTokens(nn.Module):
    """A linear layer across the sequence: transposes on both sides."""

    def __init__(self, t: int) -> None:
        super().__init__()
        self.fc = nn.Linear(t, t)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.transpose(1, 2)).transpose(1, 2)


class SliceCat(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d // 2, d // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return torch.cat([self.fc(x[..., :h]), x[..., h:] * 0.5], dim=-1)


class InPlace(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        y.mul_(0.5)
        return torch.relu_(y) + x


class FlattenBack(nn.Module):
    """A reshape to (B, T*D) and back, around a linear layer over the flat features."""

    def __init__(self, t: int, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(t * d, t * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.reshape(x.shape[0], -1)).view(x.shape)


class SeqGroupNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(2, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


def _sequence_block(rng: random.Random, t: int, d: int) -> tuple[nn.Module, str]:
    act = rng.choice(["relu", "gelu", "silu", "tanh"])
    options: list[tuple[str, Callable[[], nn.Module]]] = [
        (f"linear+{act}", lambda: LinearAct(d, act)),
        (f"residual mlp {act}", lambda: ResidualMLP(d, act)),
        ("layernorm", lambda: nn.LayerNorm(d)),
        ("rmsnorm", lambda: RMSNorm(d)),
        ("groupnorm", lambda: SeqGroupNorm(d)),
        ("attention sdpa", lambda: Attention(d, 2, by_hand=False, causal=rng.random() < 0.5)),
        ("attention by hand", lambda: Attention(d, 2, by_hand=True, causal=rng.random() < 0.5)),
        ("dropout", lambda: nn.Dropout(0.2)),
        ("mix tokens", lambda: MixTokens(t)),
        ("slice+cat", lambda: SliceCat(d)),
        ("in-place", lambda: InPlace(d)),
        ("flatten", lambda: FlattenBack(t, d)),
    ]
    name, make = rng.choice(options)
    return make(), name


# ---------------------------------------------------------------- image blocks (B, C, H, W)
class ConvNorm(nn.Module):
    def __init__(self, c: int, norm: str, depthwise: bool) -> None:
        super().__init__()
        # no bias before a norm that removes each channel's mean (as torchvision writes it): its
        # gradient would be zero up to rounding, which Adam turns into updates of about lr
        bias = norm not in ("batch", "instance")
        self.conv = nn.Conv2d(c, c, 3, padding=1, groups=c if depthwise else 1, bias=bias)
        self.norm = {"batch": lambda: nn.BatchNorm2d(c), "group": lambda: nn.GroupNorm(2, c),
                     "instance": lambda: nn.InstanceNorm2d(c, affine=True), "none": nn.Identity}[norm]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm(self.conv(x)))


class ResidualConv(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(F.gelu(self.a(x)))


class PoolUp(nn.Module):
    def __init__(self, c: int, kind: str) -> None:
        super().__init__()
        self.conv, self.kind = nn.Conv2d(c, c, 3, padding=1), kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = F.max_pool2d(x, 2) if self.kind == "max" else F.avg_pool2d(x, 2)
        return x + F.interpolate(self.conv(pooled), scale_factor=2.0, mode="nearest")


class ConcatBranches(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c // 2, 1), nn.Conv2d(c, c - c // 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], dim=1)


def _image_block(rng: random.Random, c: int) -> tuple[nn.Module, str]:
    norm = rng.choice(["batch", "group", "instance", "none"])
    options: list[tuple[str, Callable[[], nn.Module]]] = [
        (f"conv+{norm}norm", lambda: ConvNorm(c, norm, depthwise=False)),
        (f"depthwise conv+{norm}norm", lambda: ConvNorm(c, norm, depthwise=True)),
        ("residual conv", lambda: ResidualConv(c)),
        ("maxpool+up", lambda: PoolUp(c, "max")),
        ("avgpool+up", lambda: PoolUp(c, "avg")),
        ("concat branches", lambda: ConcatBranches(c)),
        ("dropout2d", lambda: nn.Dropout2d(0.2)),
    ]
    name, make = rng.choice(options)
    return make(), name


# ---------------------------------------------------------------- models
class SequenceModel(nn.Module):
    def __init__(self, stem: nn.Module, blocks: list[nn.Module], head: nn.Module, tokens: bool) -> None:
        super().__init__()
        self.stem, self.blocks, self.head, self.tokens = stem, nn.Sequential(*blocks), head, tokens

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class ImageModel(nn.Module):
    def __init__(self, c: int, blocks: list[nn.Module], classes: int, per_pixel: bool) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Conv2d(c, classes, 1) if per_pixel else nn.Linear(c, classes)
        self.per_pixel = per_pixel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.blocks(F.relu(self.stem(x)))
        return self.head(h) if self.per_pixel else self.head(h.mean((2, 3)))


def _optimizer(rng: random.Random, dtype: torch.dtype) -> Recipe:
    """SGD (with or without momentum and decay), Adam or AdamW; float32 steps get SGD
    (bench.fuzz.harness: why Adam in float32 differs by lr without any error)."""
    kind = rng.choice(["sgd", "adam", "adamw"]) if dtype == torch.float64 else "sgd"
    if kind == "sgd":
        return peakcut.SGD(lr=0.05, momentum=rng.choice([0.0, 0.9]), weight_decay=rng.choice([0.0, 1e-2]))
    # eps 1e-4: a gradient that is zero up to rounding (an attention key's bias, a bias before a
    # norm) becomes an update of about lr * rounding / eps, far below the tolerance; with the
    # default 1e-8 a correct plan and eager differ above it
    if kind == "adam":
        return peakcut.Adam(lr=1e-2, eps=1e-4, weight_decay=rng.choice([0.0, 1e-2]))
    return peakcut.AdamW(lr=1e-2, eps=1e-4, weight_decay=0.1)


def make_case(seed: int) -> Case:
    """The random training step of `seed` (the same seed gives the same case)."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    dtype = torch.float64 if rng.random() < 0.6 else torch.float32
    classes = rng.choice([3, 5])
    b = rng.choice([2, 4])
    depth = rng.randint(1, 4)
    if rng.random() < 0.65:
        t, d = rng.choice([4, 6]), rng.choice([8, 12])
        picked = [_sequence_block(rng, t, d) for _ in range(depth)]
        tokens = rng.random() < 0.5
        stem: nn.Module = nn.Embedding(17, d) if tokens else nn.Linear(5, d)
        per_token = rng.random() < 0.5
        model: nn.Module = SequenceModel(stem, [m for m, _ in picked], nn.Linear(d, classes), tokens)
        x = torch.randint(0, 17, (b, t)) if tokens else torch.randn(b, t, 5)
        y = torch.randint(0, classes, (b, t) if per_token else (b,))
        shape = f"seq B{b} T{t} D{d} {'tokens' if tokens else 'features'}"

        def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
            out = m(batch[0])
            if batch[1].dim() == 2:
                return F.cross_entropy(out.reshape(-1, out.shape[-1]), batch[1].reshape(-1))
            return F.cross_entropy(out.mean(1), batch[1])
    else:
        c, hw = rng.choice([4, 6]), rng.choice([4, 8])
        picked = [_image_block(rng, c) for _ in range(depth)]
        per_pixel = rng.random() < 0.4
        model = ImageModel(c, [m for m, _ in picked], classes, per_pixel)
        x = torch.randn(b, 3, hw, hw)
        if rng.random() < 0.3:
            x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (b, hw, hw) if per_pixel else (b,))
        layout = " channels-last" if not x.is_contiguous() else ""
        shape = f"image B{b} C{c} {hw}x{hw}{layout}"

        def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
            return F.cross_entropy(m(batch[0]), batch[1])
    model = model.to(dtype).train()
    if x.is_floating_point():
        x = x.to(dtype)
    optimizer = _optimizer(rng, dtype)
    blocks = ", ".join(name for _, name in picked)
    description = (f"{shape}, {str(dtype).removeprefix('torch.')}, [{blocks}], "
                   f"{type(optimizer).__name__}")
    return Case(seed, model, (x, y), loss_fn, optimizer, dtype, description)
