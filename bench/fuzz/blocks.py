"""The vocabulary of the random training steps (bench.fuzz.models): real layers and ops,
as blocks that keep their family's shape, so that any sequence of blocks is a valid model.

Sequences (B, T, D): linear layers and MLPs (SwiGLU too), every norm (LayerNorm, RMSNorm
by hand, GroupNorm and BatchNorm across a transpose), attention through SDPA and by hand (causal or
not), attention pooling (a softmax along the sequence), dropout, a linear layer across the
sequence, slices and concatenation, index_select by an int64 buffer, a cumsum, a 0-dim
parameter, a layer applied twice, masks from the data (masked_fill, where), in-place ops
and a flatten. Images (B, C, H, W): convolutions (depthwise, strided, transposed) with
batch, group, instance or no norm, residuals, pooling and upsampling, squeeze-excite,
concatenated branches, 2-d dropout.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def flip(rng: random.Random, p: float) -> bool:
    """True with probability p; False when rng.random() is 0, where hypothesis shrinks it
    (a shrunk case leaves out what it does not need)."""
    return rng.random() >= 1 - p


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


class SeqBatchNorm(nn.Module):
    """BatchNorm1d over the features, between two transposes (batch statistics: no batch
    fission crosses it)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


class SwiGLU(nn.Module):
    """Llama's MLP: silu(gate) * up, then down, as a residual."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, 2 * d, bias=False), nn.Linear(d, 2 * d, bias=False), \
            nn.Linear(2 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


class TokenPool(nn.Module):
    """Attention pooling over the sequence (a softmax along dim 1, not the last), added back
    to every token."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.score = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.score(x).softmax(dim=1)
        return x + (w * x).sum(1, keepdim=True)


class Shuffle(nn.Module):
    """index_select along the sequence by a fixed permutation (an int64 buffer)."""

    def __init__(self, t: int) -> None:
        super().__init__()
        self.register_buffer("perm", torch.arange(t).roll(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.index_select(1, self.perm) * 0.5 + x


class CumulativeMean(nn.Module):
    """A causal running mean over the sequence (cumsum / positions) and a 0-dim learned scale."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype).view(1, -1, 1)
        return x + self.scale * x.cumsum(1) / n


class SharedTwice(nn.Module):
    """One linear layer applied twice (a parameter read twice, as tied weights are)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.fc(x)))


class MaskedFill(nn.Module):
    """A mask from the data (positive first feature) through masked_fill and where."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x[..., :1] > 0
        y = self.fc(x).masked_fill(mask, 0.0)
        return torch.where(mask, x, y)


def sequence_block(rng: random.Random, t: int, d: int) -> tuple[nn.Module, str]:
    act = rng.choice(["relu", "gelu", "silu", "tanh"])
    options: list[tuple[str, Callable[[], nn.Module]]] = [
        (f"linear+{act}", lambda: LinearAct(d, act)),
        (f"residual mlp {act}", lambda: ResidualMLP(d, act)),
        ("layernorm", lambda: nn.LayerNorm(d)),
        ("rmsnorm", lambda: RMSNorm(d)),
        ("groupnorm", lambda: SeqGroupNorm(d)),
        ("batchnorm", lambda: SeqBatchNorm(d)),
        ("attention sdpa", lambda: Attention(d, 2, by_hand=False, causal=flip(rng, 0.5))),
        ("attention by hand", lambda: Attention(d, 2, by_hand=True, causal=flip(rng, 0.5))),
        ("dropout", lambda: nn.Dropout(0.2)),
        ("mix tokens", lambda: MixTokens(t)),
        ("slice+cat", lambda: SliceCat(d)),
        ("in-place", lambda: InPlace(d)),
        ("flatten", lambda: FlattenBack(t, d)),
        ("swiglu", lambda: SwiGLU(d)),
        ("token pool", lambda: TokenPool(d)),
        ("shuffle", lambda: Shuffle(t)),
        ("cumulative mean", lambda: CumulativeMean()),
        ("shared twice", lambda: SharedTwice(d)),
        ("masked fill", lambda: MaskedFill(d)),
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


class SqueezeExcite(nn.Module):
    """Channel attention: a global average, two 1x1 layers, a sigmoid gate per channel."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.down, self.up = nn.Conv2d(c, 2, 1), nn.Conv2d(2, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.up(F.relu(self.down(F.adaptive_avg_pool2d(x, 1)))))


class DownUp(nn.Module):
    """A strided convolution down and a transposed convolution back up, as a residual."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.down = nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(c, c, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(F.silu(self.down(x)))


def image_block(rng: random.Random, c: int) -> tuple[nn.Module, str]:
    norm = rng.choice(["batch", "group", "instance", "none"])
    options: list[tuple[str, Callable[[], nn.Module]]] = [
        (f"conv+{norm}norm", lambda: ConvNorm(c, norm, depthwise=False)),
        (f"depthwise conv+{norm}norm", lambda: ConvNorm(c, norm, depthwise=True)),
        ("residual conv", lambda: ResidualConv(c)),
        ("maxpool+up", lambda: PoolUp(c, "max")),
        ("avgpool+up", lambda: PoolUp(c, "avg")),
        ("concat branches", lambda: ConcatBranches(c)),
        ("dropout2d", lambda: nn.Dropout2d(0.2)),
        ("squeeze-excite", lambda: SqueezeExcite(c)),
        ("down+up", lambda: DownUp(c)),
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
