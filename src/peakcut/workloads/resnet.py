"""ResNet-50 (He et al. 2016), defined in-project (torchvision is not a dependency).

Architecture follows ``torchvision.models.resnet50`` ("ResNet v1.5": the stride-2 of a
down-sampling bottleneck sits on its 3x3 convolution): 7x7/2 stem conv + BatchNorm + ReLU,
3x3/2 max-pool, four stages of bottleneck blocks (1x1 -> 3x3 -> 1x1, expansion 4) with
[3, 4, 6, 3] blocks, global average pool and a fully connected classifier.
Paper size has 25,557,032 parameters, matching torchvision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ResNetConfig:
    """Shape of a bottleneck ResNet and of its input images."""

    blocks: tuple[int, ...]
    width: int
    num_classes: int
    image: int


PAPER = ResNetConfig(blocks=(3, 4, 6, 3), width=64, num_classes=1000, image=224)
MEDIUM = PAPER      # the paper network; the medium batch (base.py) is what is smaller
TINY = ResNetConfig(blocks=(1, 1, 1, 1), width=8, num_classes=10, image=32)
CONFIGS = {"paper": PAPER, "medium": MEDIUM, "tiny": TINY}


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (strided) -> 1x1 expand, each with BatchNorm, plus a residual."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + identity)


class ResNet(nn.Module):
    """Bottleneck ResNet classifier."""

    def __init__(self, cfg: ResNetConfig) -> None:
        super().__init__()
        w = cfg.width
        self.conv1 = nn.Conv2d(3, w, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages: list[nn.Module] = []
        in_ch = w
        for i, n_blocks in enumerate(cfg.blocks):
            width = w * 2**i
            blocks: list[nn.Module] = []
            for j in range(n_blocks):
                stride = 2 if (i > 0 and j == 0) else 1
                blocks.append(Bottleneck(in_ch, width, stride))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(in_ch, cfg.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def make_resnet50(size: str, batch_size: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """ResNet-50 (or its tiny sibling) and a batch ``(images, labels)``."""
    cfg = CONFIGS[size]
    model = ResNet(cfg)
    images = torch.randn(batch_size, 3, cfg.image, cfg.image)
    labels = torch.randint(0, cfg.num_classes, (batch_size,))
    return model, (images, labels)


def classification_loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Mean cross-entropy of ``model(images)`` against integer ``labels``."""
    images, labels = batch
    return F.cross_entropy(model(images), labels)
