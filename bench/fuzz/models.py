"""Random training steps: a model assembled from a vocabulary of real layers, a batch, a
loss and an optimizer, all drawn from one seed.

Two families (blocks from bench.fuzz.blocks): sequences (B, T, D), entered by token ids
through an embedding or by float features through a linear layer; images (B, C, H, W),
entered through a convolution (sometimes channels-last). Blocks may be wrapped in what the
user's own code adds (bench.fuzz.user_code: activation checkpointing with dropout in both
modes, forward and gradient hooks, closed-over tensors, tensors made on the fly). Sometimes
the user's own loop
(bench.fuzz.loop: torch.optim in param groups, clipping, an LR schedule), sometimes bf16
autocast.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import peakcut
from bench.fuzz.blocks import ImageModel, SequenceModel, flip, image_block, sequence_block
from bench.fuzz.loop import UserLoop
from bench.fuzz.user_code import add_user_code
from peakcut.runtime.equivalence import torch_optimizer
from peakcut.spec.optimizers import Recipe


@dataclass
class Case:
    """One random training step."""

    seed: int                     # -1: drawn by hypothesis
    model: nn.Module
    batch: tuple[torch.Tensor, ...]
    loss_fn: Callable[[nn.Module, Any], torch.Tensor]
    optimizer: Recipe | None      # a recipe over all trainable parameters, or
    loop: UserLoop | None         # the user's loop: torch.optim in param groups, clipping, a schedule
    dtype: torch.dtype
    autocast: bool                # loss_fn runs the model under torch.autocast("cpu", bfloat16)
    description: str
    rng: random.Random            # what drew the case; the harness's walk draws on from it
    precise_loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None   # autocast: loss_fn without it
    user_code: tuple[str, ...] = ()   # what the user's code adds around blocks (bench.fuzz.user_code)

    def as_user_loop(self) -> UserLoop:
        """The case's loop for bench.fuzz.loop: the user's own, or its recipe's optimizer."""
        recipe = self.optimizer
        return self.loop or UserLoop(lambda m: torch_optimizer(recipe, m.parameters()))

    @property
    def tags(self) -> tuple[str, ...]:
        """What kind of case this is (the rows of bench.fuzz's case table)."""
        x = self.batch[0]
        return (("sequence model" if isinstance(self.model, SequenceModel) else "image model"),
                "bf16 autocast" if self.autocast else str(self.dtype).removeprefix("torch."),
                "user's torch.optim loop" if self.loop is not None else "optimizer recipe",
                *(["channels-last input"] * (x.dim() == 4 and not x.is_contiguous())), *self.user_code)


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


MAX_BLOCKS = 4


def _blocks(rng: random.Random, block: Callable[[], tuple[nn.Module, str]]) -> list[tuple[nn.Module, str]]:
    """One to MAX_BLOCKS blocks: after each, another with probability 0.7. Drawn one by one
    (not a depth first), so that a shrinker can drop any block with its own choices."""
    picked = [block()]
    while len(picked) < MAX_BLOCKS and rng.random() >= 0.3:
        picked.append(block())
    return picked


def _user_loop(rng: random.Random, model: nn.Module, dtype: torch.dtype) -> tuple[UserLoop, str]:
    """A torch.optim optimizer as a user writes one: matrices with weight decay, the rest
    without and at half the lr; sometimes a frozen stem, a head bias left out of the
    optimizer (its gradient accumulates in .grad, as with loss.backward()), clipping, an LR
    schedule. Adam and AdamW only in float64 (see _optimizer)."""
    kind = rng.choice(["sgd", "adam", "adamw"]) if dtype == torch.float64 else "sgd"
    options: dict[str, Any] = {"maximize": flip(rng, 0.15)}
    if kind == "sgd":
        momentum = rng.choice([0.0, 0.9])
        options.update(momentum=momentum, nesterov=momentum > 0 and flip(rng, 0.5))
    else:
        options.update(eps=1e-4, amsgrad=kind == "adam" and flip(rng, 0.4))
    lr = 0.05 if kind == "sgd" else 1e-2
    freeze = flip(rng, 0.2)
    leave_out = flip(rng, 0.15)
    if freeze:
        model.stem.requires_grad_(False)
    head_bias = getattr(model.head, "bias", None)
    clip = rng.choice([None, None, 0.1, 1.0])
    schedule = rng.choice([None, "inverse", "warm-up"])
    lr_lambda = {None: None, "inverse": lambda k: 1.0 / (1 + k), "warm-up": lambda k: min(1.0, (k + 1) / 3)}[schedule]
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]

    def make_optimizer(m: nn.Module) -> torch.optim.Optimizer:
        out = getattr(m.head, "bias", None) if leave_out else None
        trainable = [p for p in m.parameters() if p.requires_grad and p is not out]
        decay = [p for p in trainable if p.dim() > 1]
        rest = [p for p in trainable if p.dim() <= 1]
        groups = [{"params": decay, "weight_decay": 0.05}, {"params": rest, "weight_decay": 0.0, "lr": lr / 2}]
        return cls([g for g in groups if g["params"]], lr=lr, foreach=False, **options)

    parts = [f"torch.optim.{cls.__name__}({', '.join(f'{k}={v}' for k, v in options.items() if v)}) in groups"]
    parts += ["frozen stem"] * freeze + ["head bias outside"] * (leave_out and head_bias is not None)
    parts += [f"clip {clip}"] * (clip is not None) + [f"{schedule} schedule"] * (schedule is not None)
    return UserLoop(make_optimizer, clip, lr_lambda), ", ".join(parts)


def _autocast(loss_fn: Callable[[nn.Module, Any], torch.Tensor]) -> Callable[[nn.Module, Any], torch.Tensor]:
    def under_autocast(m: nn.Module, batch: Any) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return loss_fn(m, batch)
    return under_autocast


def make_case(seed: int) -> Case:
    """The random training step of `seed` (the same seed gives the same case)."""
    return draw_case(random.Random(seed), seed)


def draw_case(rng: random.Random, seed: int | None = None) -> Case:
    """The random training step drawn from `rng`, which the case keeps for its walk over the
    rules (bench.fuzz.harness). Weights and data come from torch's generator seeded with
    `seed`, or (None) with a number drawn from rng. rng may be hypothesis's (st.randoms()):
    every choice is then a hypothesis choice, and a failing case shrinks to fewer and
    simpler blocks, smaller shapes and fewer moves (tests/fuzz/test_fuzz_shrinks.py)."""
    torch.manual_seed(rng.randrange(1 << 16) if seed is None else seed)
    dtype = torch.float64 if flip(rng, 0.6) else torch.float32
    classes = rng.choice([3, 5])
    b = rng.choice([2, 4])
    if flip(rng, 0.65):
        t, d = rng.choice([4, 6]), rng.choice([8, 12])
        picked, user_code = add_user_code(rng, _blocks(rng, lambda: sequence_block(rng, t, d)), (d,), dtype,
                                          image=False)
        tokens = flip(rng, 0.5)
        stem: nn.Module = nn.Embedding(17, d) if tokens else nn.Linear(5, d)
        per_token = flip(rng, 0.5)
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
        picked, user_code = add_user_code(rng, _blocks(rng, lambda: image_block(rng, c)), (c, 1, 1), dtype,
                                          image=True)
        per_pixel = flip(rng, 0.4)
        model = ImageModel(c, [m for m, _ in picked], classes, per_pixel)
        x = torch.randn(b, 3, hw, hw)
        if flip(rng, 0.3):
            x = x.to(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (b, hw, hw) if per_pixel else (b,))
        layout = " channels-last" if not x.is_contiguous() else ""
        shape = f"image B{b} C{c} {hw}x{hw}{layout}"

        def loss_fn(m: nn.Module, batch: Any) -> torch.Tensor:
            return F.cross_entropy(m(batch[0]), batch[1])
    model = model.to(dtype).train()
    if x.is_floating_point():
        x = x.to(dtype)
    optimizer: Recipe | None = _optimizer(rng, dtype)
    loop, how = None, type(optimizer).__name__
    if flip(rng, 0.4):
        optimizer = None
        loop, how = _user_loop(rng, model, dtype)
    autocast = dtype == torch.float32 and flip(rng, 0.5)
    precise_loss_fn = loss_fn if autocast else None
    if autocast:
        loss_fn = _autocast(loss_fn)
    blocks = ", ".join(name for _, name in picked)
    description = (f"{shape}, {str(dtype).removeprefix('torch.')}{' bf16 autocast' if autocast else ''}, "
                   f"[{blocks}], {how}")
    return Case(-1 if seed is None else seed, model, (x, y), loss_fn, optimizer, loop, dtype, autocast,
                description, rng, precise_loss_fn, tuple(user_code))
