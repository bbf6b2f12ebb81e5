"""CIFAR ResNets of depth 6n+2, laid out as in the paper's code, exposing their layer points.

A *layer point* is the output of the stem or of one residual block; ResNet-32 has 16 of
them (the paper's analysis figure's "Layer Index" 1..16), ResNet-110 has 55. The split into
K local modules, the linear probes and the mutual-information estimators all address the
network through these points, so they always talk about the same features.

The forward pass is a plain forward pass: local losses, `backward` and `detach` at module
boundaries belong to the trainer (`infopro.train`).
"""

import math

import torch
import torch.nn as nn

ARCHS = {"resnet32": 32, "resnet110": 110}
WIDTHS = (16, 32, 64)  # channels of the three stages; the stem has WIDTHS[0]


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN plus shortcut, then ReLU.

    Down-sampling shortcuts are a 1x1 convolution + BN ("option B"), as in the paper's code;
    dropout is omitted because every released command sets its rate to 0.
    """

    def __init__(self, in_channels: int, channels: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(nn.Conv2d(in_channels, channels, 1, stride, bias=False),
                                          nn.BatchNorm2d(channels))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def stem(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(3, channels, 3, 1, 1, bias=False), nn.BatchNorm2d(channels),
                         nn.ReLU(inplace=True))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 inputs: stem, three stages of n blocks, global pool + FC head.

    `layers[i]` produces layer point i+1; `head` maps the last point to logits.
    """

    def __init__(self, depth: int, num_classes: int = 10):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"CIFAR ResNet depth must be 6n+2 with n >= 1, got {depth}")
        self.blocks_per_stage = (depth - 2) // 6
        layers = [stem(WIDTHS[0])]
        in_channels = WIDTHS[0]
        for stage, channels in enumerate(WIDTHS):
            for block in range(self.blocks_per_stage):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(in_channels, channels, stride))
                in_channels = channels
        self.layers = nn.ModuleList(layers)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_channels, num_classes))
        init_like_paper(self)

    @property
    def num_layer_points(self) -> int:
        return len(self.layers)

    def layer_shape(self, point: int) -> tuple[int, int, int]:
        """(channels, height, width) of layer point `point` (1-based) for a 32x32 input."""
        stage = 0 if point == 1 else (point - 2) // self.blocks_per_stage
        size = 32 >> stage
        return WIDTHS[stage], size, size

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

    def forward_intermediates(self, x, points) -> dict[int, torch.Tensor]:
        """Features at the requested layer points (1-based), computing only as deep as needed."""
        wanted = set(points)
        if not wanted or min(wanted) < 1 or max(wanted) > self.num_layer_points:
            raise ValueError(f"layer points must lie in 1..{self.num_layer_points}, got {sorted(wanted)}")
        features = {}
        for point, layer in enumerate(self.layers[:max(wanted)], start=1):
            x = layer(x)
            if point in wanted:
                features[point] = x
        return features


def init_like_paper(module: nn.Module) -> None:
    """He-normal convs N(0, sqrt(2 / (k*k*C_out))), BN weight 1 / bias 0, Linear left at default.

    Applied by the paper's code to the backbone *and* to its decoders and auxiliary heads
    (its init loop runs after they are built), so `infopro.local` calls it on those too.
    """
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            fan_out = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / fan_out))
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def build_backbone(arch: str, num_classes: int = 10) -> CifarResNet:
    return CifarResNet(ARCHS[arch], num_classes)
