"""U-Net (Ronneberger et al. 2015) and U-Net++ (Zhou et al. 2018), defined in-project.

Both use the same building block: two 3x3 convolutions, each followed by BatchNorm and ReLU
("double conv"); 2x2 max-pooling to go down and a 2x2 stride-2 transposed convolution to go
up; skip connections by channel concatenation; a final 1x1 convolution to per-pixel class
logits. Convolutions are padded ("same"), so outputs have the input's spatial size.

* U-Net: base 64 channels, depth 4 (64-128-256-512-1024), 2 output classes as in the original
  paper. Paper size: 31,037,698 parameters (same as the common ``milesial/Pytorch-UNet``).
* U-Net++: nested, dense skip pathways: node ``X[i][j]`` (``j >= 1``) convolves the
  concatenation of ``X[i][0..j-1]`` and the up-sampled ``X[i+1][j-1]``. Channel widths
  32-64-128-256-512 as in Zhou et al. (their Table 1 reports 9.04M parameters), one
  transposed convolution per nested node as in their reference Keras code, BatchNorm added,
  no deep supervision (the loss uses the final node ``X[0][4]``), 2 output classes.
  Paper size: 9,045,858 parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class UNetConfig:
    """Widths/depth of a U-Net-family model and its input images."""

    base: int
    depth: int
    num_classes: int
    image: int
    in_channels: int = 3


UNET_PAPER = UNetConfig(base=64, depth=4, num_classes=2, image=256)
UNETPP_PAPER = UNetConfig(base=32, depth=4, num_classes=2, image=256)
TINY = UNetConfig(base=8, depth=3, num_classes=2, image=32)
UNET = {"paper": UNET_PAPER, "medium": UNetConfig(base=64, depth=4, num_classes=2, image=128), "tiny": TINY}
UNETPP = {"paper": UNETPP_PAPER, "medium": UNetConfig(base=32, depth=4, num_classes=2, image=128), "tiny": TINY}
"""Per size; medium is the paper network on 128x128 images."""


class DoubleConv(nn.Sequential):
    """(3x3 conv -> BatchNorm -> ReLU) x 2."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__(
            nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(),
            nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_ch),
            nn.ReLU(),
        )


def _up(in_ch: int, out_ch: int) -> nn.ConvTranspose2d:
    """2x2 stride-2 transposed convolution (doubles height and width)."""
    return nn.ConvTranspose2d(in_ch, out_ch, 2, stride=2)


class UNet(nn.Module):
    """U-Net: contracting path, expanding path, skip concatenation at every level."""

    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__()
        widths = [cfg.base * 2**i for i in range(cfg.depth + 1)]
        self.inc = DoubleConv(cfg.in_channels, widths[0])
        self.downs = nn.ModuleList(DoubleConv(widths[i], widths[i + 1]) for i in range(cfg.depth))
        self.ups = nn.ModuleList(_up(widths[i + 1], widths[i]) for i in reversed(range(cfg.depth)))
        self.up_convs = nn.ModuleList(
            DoubleConv(2 * widths[i], widths[i]) for i in reversed(range(cfg.depth))
        )
        self.outc = nn.Conv2d(widths[0], cfg.num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inc(x)
        skips = [x]
        for down in self.downs:
            x = down(F.max_pool2d(x, 2))
            skips.append(x)
        skips.pop()  # the bottleneck output is x itself
        for up, conv in zip(self.ups, self.up_convs, strict=True):
            x = conv(torch.cat([skips.pop(), up(x)], dim=1))
        return self.outc(x)


class UNetPlusPlus(nn.Module):
    """U-Net++: nested dense skip pathways between encoder and decoder nodes."""

    def __init__(self, cfg: UNetConfig) -> None:
        super().__init__()
        self.depth = cfg.depth
        widths = [cfg.base * 2**i for i in range(cfg.depth + 1)]
        nodes: dict[str, nn.Module] = {}
        ups: dict[str, nn.Module] = {}
        for i in range(cfg.depth + 1):
            in_ch = cfg.in_channels if i == 0 else widths[i - 1]
            nodes[f"x{i}_0"] = DoubleConv(in_ch, widths[i])
        for j in range(1, cfg.depth + 1):
            for i in range(cfg.depth + 1 - j):
                ups[f"x{i}_{j}"] = _up(widths[i + 1], widths[i])
                nodes[f"x{i}_{j}"] = DoubleConv(widths[i] * (j + 1), widths[i])
        self.nodes = nn.ModuleDict(nodes)
        self.ups = nn.ModuleDict(ups)
        self.outc = nn.Conv2d(widths[0], cfg.num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid: list[list[torch.Tensor]] = []
        h = x
        for i in range(self.depth + 1):
            h = self.nodes[f"x{i}_0"](h if i == 0 else F.max_pool2d(h, 2))
            grid.append([h])
        for j in range(1, self.depth + 1):
            for i in range(self.depth + 1 - j):
                name = f"x{i}_{j}"
                up = self.ups[name](grid[i + 1][j - 1])
                grid[i].append(self.nodes[name](torch.cat([*grid[i], up], dim=1)))
        return self.outc(grid[0][self.depth])


def segmentation_batch(cfg: UNetConfig, batch_size: int) -> tuple[torch.Tensor, ...]:
    images = torch.randn(batch_size, cfg.in_channels, cfg.image, cfg.image)
    masks = torch.randint(0, cfg.num_classes, (batch_size, cfg.image, cfg.image))
    return images, masks


def make_unet(size: str, batch_size: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """U-Net (or its tiny sibling) and a batch ``(images, per-pixel labels)``."""
    cfg = UNET[size]
    return UNet(cfg), segmentation_batch(cfg, batch_size)


def make_unetpp(size: str, batch_size: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """U-Net++ (or its tiny sibling) and a batch ``(images, per-pixel labels)``."""
    cfg = UNETPP[size]
    return UNetPlusPlus(cfg), segmentation_batch(cfg, batch_size)


def segmentation_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Per-pixel cross-entropy of ``model(images)`` (B, C, H, W) against labels (B, H, W)."""
    images, masks = batch
    return F.cross_entropy(model(images), masks)
