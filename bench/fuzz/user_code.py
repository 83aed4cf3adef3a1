"""What users' own code adds around a layer, for the random training steps (bench.fuzz.models).

Each wraps one drawn block (bench.fuzz.blocks) and keeps its input's shape, so it fits in any
model of either family:

- activation checkpointing with dropout inside, in both of torch.utils.checkpoint's modes
  (the recompute must draw the forward's masks);
- a forward hook and a forward pre-hook registered on the block;
- gradient hooks: on an activation (`register_hook` inside forward) and on a parameter
  (registered once, as a user does after building the model);
- a tensor the block reads that is neither parameter nor buffer: a plain tensor attribute
  or one held by a closure;
- a tensor made on the fly: a buffer registered on the block's first call, or a plain
  attribute kept from it.

`feature_shape` is the shape that broadcasts over the block's output along its features:
(D,) for sequences (B, T, D), (C, 1, 1) for images (B, C, H, W).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from bench.fuzz.blocks import flip


class Checkpointed(nn.Module):
    """The block and a dropout after it, run under torch.utils.checkpoint."""

    def __init__(self, block: nn.Module, reentrant: bool, dropout2d: bool) -> None:
        super().__init__()
        self.block, self.reentrant = block, reentrant
        self.drop = nn.Dropout2d(0.25) if dropout2d else nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(lambda h: self.drop(self.block(h)), x, use_reentrant=self.reentrant)


def _scale_output(_module: nn.Module, _args: Any, out: torch.Tensor) -> torch.Tensor:
    return out * 0.75


def _shift_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    return (args[0] + 0.125, *args[1:])


def _halve(grad: torch.Tensor) -> torch.Tensor:
    return grad * 0.5


class ActivationHook(nn.Module):
    """Halves the gradient of the block's output with a hook registered in forward."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x) + 0.0     # a tensor of its own: the hook is not on a view of x
        if y.requires_grad:
            y.register_hook(_halve)
        return y


class ParameterHook(nn.Module):
    """Halves the gradient of the block's first parameter with a hook registered once; a copy
    (the eager reference is a deepcopy) registers its own."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self._register()

    def _register(self) -> None:
        first = next(self.block.parameters())
        first.register_hook(_halve)

    def __deepcopy__(self, memo: dict[int, Any]) -> ParameterHook:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        new._register()
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class ClosedOver(nn.Module):
    """Scales the block's output by a tensor that is neither a parameter nor a buffer."""

    def __init__(self, block: nn.Module, scale: torch.Tensor, in_closure: bool) -> None:
        super().__init__()
        self.block = block
        if in_closure:
            self.scale_of: Callable[[], torch.Tensor] = lambda: scale
        else:
            self.scale = scale
            self.scale_of = lambda: self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x) * self.scale_of()


class MadeOnTheFly(nn.Module):
    """Adds a ramp over the features that the first call makes and keeps (a buffer
    registered then, or a plain attribute)."""

    def __init__(self, block: nn.Module, feature_shape: tuple[int, ...], as_buffer: bool) -> None:
        super().__init__()
        self.block, self.feature_shape, self.as_buffer = block, feature_shape, as_buffer
        self.ramp: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ramp = getattr(self, "ramp_buffer", None) if self.as_buffer else self.ramp
        if ramp is None:
            n = self.feature_shape[0]
            ramp = torch.linspace(0.0, 0.5, n, dtype=x.dtype, device=x.device).view(self.feature_shape)
            if self.as_buffer:
                self.register_buffer("ramp_buffer", ramp, persistent=False)
            else:
                self.ramp = ramp
        return self.block(x) + ramp


FEATURES = ("checkpoint non-reentrant", "checkpoint reentrant", "forward hook", "activation hook",
            "parameter hook", "closed-over tensor", "made on the fly")
"""The case tags of user code (bench.fuzz's case table counts each)."""


def add_user_code(rng: random.Random, picked: list[tuple[nn.Module, str]], feature_shape: tuple[int, ...],
                  dtype: torch.dtype, image: bool) -> tuple[list[tuple[nn.Module, str]], list[str]]:
    """Wrap drawn blocks in user code: each kind with its own probability, on a random block.
    Returns the blocks (renamed where wrapped) and the kinds used (FEATURES)."""
    blocks = list(picked)
    used: list[str] = []

    def wrap(tag: str, make: Callable[[nn.Module], nn.Module], needs_params: bool = False) -> None:
        candidates = [i for i, (m, _) in enumerate(blocks) if not needs_params or any(True for _ in m.parameters())]
        if not candidates:
            return
        i = rng.choice(candidates)
        module, name = blocks[i]
        blocks[i] = (make(module), f"{tag}({name})")
        used.append(tag)

    if flip(rng, 0.3):
        reentrant = flip(rng, 0.5)
        wrap(f"checkpoint {'reentrant' if reentrant else 'non-reentrant'}",
             lambda m: Checkpointed(m, reentrant, dropout2d=image and flip(rng, 0.5)))
    if flip(rng, 0.2):
        pre = flip(rng, 0.5)

        def hooked(m: nn.Module) -> nn.Module:
            if pre:
                m.register_forward_pre_hook(_shift_input)
            else:
                m.register_forward_hook(_scale_output)
            return m
        wrap("forward hook", hooked)
    if flip(rng, 0.2):
        wrap("activation hook", ActivationHook)
    if flip(rng, 0.2):
        wrap("parameter hook", ParameterHook, needs_params=True)
    if flip(rng, 0.2):
        scale = (torch.rand(feature_shape, dtype=dtype) + 0.5)
        in_closure = flip(rng, 0.5)
        wrap("closed-over tensor", lambda m: ClosedOver(m, scale, in_closure))
    if flip(rng, 0.2):
        as_buffer = flip(rng, 0.5)
        wrap("made on the fly", lambda m: MadeOnTheFly(m, feature_shape, as_buffer))
    return blocks, used
