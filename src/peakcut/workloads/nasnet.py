"""Random NASNet-like networks, for the incremental-scheduling benchmark (MAGIS §7.3).

A network is a stem convolution and a stack of cells. As in NASNet-A (Zoph et
al., 2018) a cell reads the outputs of the two cells before it (here: half
of the cells, at random; the others only the previous one, which makes the
narrow waists that GraphPartition cuts at), each through a 1x1
"preprocessing" convolution to the cell's own width; inside, a
few blocks each pick two earlier hidden states, apply one random operation to
each (separable 3x3/5x5 convolution, 3x3 average or max pooling, identity,
1x1 convolution) and add the results; the blocks nobody consumed are
concatenated and projected by a 1x1 convolution. Cell widths vary at random,
so tensors differ in size and the order of branches matters. Every choice
comes from one seeded generator, so a seed names a network.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

OPS = ("sep3", "sep5", "avg3", "max3", "identity", "conv1")


class SepConv(nn.Module):
    """ReLU, depthwise k x k, pointwise 1x1 (NASNet's separable convolution, one repeat)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=channels, bias=False)
        self.pointwise = nn.Conv2d(channels, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.depthwise(torch.relu(x)))


def make_op(name: str, channels: int) -> nn.Module:
    if name == "sep3":
        return SepConv(channels, 3)
    if name == "sep5":
        return SepConv(channels, 5)
    if name == "avg3":
        return nn.AvgPool2d(3, stride=1, padding=1)
    if name == "max3":
        return nn.MaxPool2d(3, stride=1, padding=1)
    if name == "identity":
        return nn.Identity()
    if name == "conv1":
        return nn.Sequential(nn.ReLU(), nn.Conv2d(channels, channels, 1, bias=False))
    raise ValueError(f"unknown NASNet op {name!r}; known: {OPS}")


@dataclass(frozen=True)
class BlockSpec:
    inputs: tuple[int, int]   # indices into the cell's hidden states (0, 1 = the two cell inputs)
    ops: tuple[str, str]


class Cell(nn.Module):
    def __init__(self, in_prev: int, in_prev_prev: int, channels: int, blocks: list[BlockSpec]) -> None:
        super().__init__()
        self.blocks = blocks
        self.pre = nn.Conv2d(in_prev, channels, 1, bias=False)
        reads_prev_prev = any(1 in b.inputs for b in blocks)
        self.pre_prev = nn.Conv2d(in_prev_prev, channels, 1, bias=False) if reads_prev_prev else None
        self.ops = nn.ModuleList(nn.ModuleList(make_op(o, channels) for o in b.ops) for b in blocks)
        used = {i for b in blocks for i in b.inputs}
        self.loose = [i + 2 for i in range(len(blocks)) if i + 2 not in used]
        self.project = nn.Conv2d(channels * len(self.loose), channels, 1, bias=False)

    def forward(self, prev: torch.Tensor, prev_prev: torch.Tensor) -> torch.Tensor:
        states = [self.pre(prev), self.pre_prev(prev_prev) if self.pre_prev is not None else prev]
        for block, ops in zip(self.blocks, self.ops, strict=True):
            a, b = block.inputs
            first, second = cast(nn.ModuleList, ops)  # built above: one pair per block
            states.append(first(states[a]) + second(states[b]))
        return self.project(torch.cat([states[i] for i in self.loose], dim=1))


class RandomNASNet(nn.Module):
    """A stem, `cells` random cells, global average pooling and a classifier."""

    def __init__(self, seed: int, cells: int = 6, blocks: int = 4, channels: int = 8,
                 classes: int = 10) -> None:
        super().__init__()
        rng = random.Random(seed)
        self.stem = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        widths = [channels, channels]
        modules = []
        for _ in range(cells):
            two_inputs = rng.random() < 0.5
            spec: list[BlockSpec] = []
            for b in range(blocks):
                # block 0 reads the cell's inputs; later ones any earlier state (never state 1 when
                # the cell has one input)
                choices = [0, 1] if b == 0 and two_inputs else [i for i in range(2 + b) if i != 1 or two_inputs]
                first = 0 if b == 0 else rng.choice(choices)
                second = 1 if b == 0 and two_inputs else rng.choice(choices)
                spec.append(BlockSpec((first, second), (rng.choice(OPS), rng.choice(OPS))))
            width = channels * rng.choice((1, 2, 3))
            modules.append(Cell(widths[-1], widths[-2], width, spec))
            widths.append(width)
        self.cells = nn.ModuleList(modules)
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prev = prev_prev = self.stem(x)
        for cell in self.cells:
            prev, prev_prev = cell(prev, prev_prev), prev
        return self.head(prev.mean(dim=(2, 3)))


def random_nasnet(seed: int, *, cells: int = 6, blocks: int = 4, channels: int = 8, image: int = 16,
                  batch: int = 2) -> tuple[nn.Module, torch.Tensor]:
    """A random NASNet-like network (eval mode) and an input batch."""
    torch.manual_seed(seed)
    model = RandomNASNet(seed, cells=cells, blocks=blocks, channels=channels).eval()
    return model, torch.randn(batch, 3, image, image)
