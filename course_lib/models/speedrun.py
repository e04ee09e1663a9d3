"""The workbook's speed-run network: a small residual CNN in the style of airbench (Keller Jordan, "94% on CIFAR-10 in
3.29 seconds on a single GPU", arXiv:2404.00498) and of Myrtle.ai's ResNet-9 (David Page, "How to train your ResNet",
2018), sized for 64 px tiles on a few CPU cores.

    stem   2x2 conv, stride 2 (patchify: 64 px -> 32 px), BatchNorm, GELU
    group  3x3 conv (width up) -> 2x2 max-pool -> BatchNorm -> GELU, then a residual block of
           two 3x3 conv + BatchNorm + GELU, added to the group's input      x3 (32 -> 16 -> 8 -> 4 px)
    head   global max-pool -> linear, its output scaled by 1/8 (airbench: small logits early on)

Registered with timm, so `timm.create_model("speedrun_resnet", num_classes=10)` and every notebook can use it;
`speedrun_resnet_small` halves the widths, and `speedrun_resnet_tiny` (notebook 13's distillation student) halves them
again. Widths (64, 128, 256): 1,941,066 parameters with 10 classes (`tests/test_speedrun.py` checks the number).
`activation="relu"` (Config.activation) puts ReLU where GELU is, as in Page's ResNet-9; airbench94 uses GELU.
"""
from __future__ import annotations

import torch
from timm.models import register_model
from torch import nn

LOGIT_SCALE = 1 / 8  # airbench divides the logits so that the first steps do not saturate the softmax
ACTIVATIONS = {"gelu": nn.GELU, "relu": nn.ReLU}  # Config.activation's names; gelu is the default


def _conv_bn(in_channels: int, out_channels: int, activation: str = "gelu") -> list[nn.Module]:
    return [nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False), nn.BatchNorm2d(out_channels),
            ACTIVATIONS[activation]()]


class ResidualBlock(nn.Module):
    """Two 3x3 conv + BatchNorm + GELU (or `activation`), added to the input (He et al. 2016, arXiv:1512.03385)."""

    def __init__(self, channels: int, activation: str = "gelu"):
        super().__init__()
        self.layers = nn.Sequential(*_conv_bn(channels, channels, activation), *_conv_bn(channels, channels, activation))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.layers(x)


class ConvGroup(nn.Module):
    """Widen, halve the resolution (max-pool after the conv, as airbench does: the conv sees the
    full resolution), normalise, then one residual block."""

    def __init__(self, in_channels: int, out_channels: int, activation: str = "gelu"):
        super().__init__()
        self.widen = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.norm = nn.BatchNorm2d(out_channels)
        self.activation = ACTIVATIONS[activation]()
        self.block = ResidualBlock(out_channels, activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.activation(self.norm(self.pool(self.widen(x)))))


class SpeedrunResNet(nn.Module):
    """Follows timm's model interface (`num_classes`, `forward_features`, `forward_head`,
    `get_classifier`, `reset_classifier`), so transfer learning and freezing work unchanged."""

    def __init__(self, num_classes: int = 1000, in_chans: int = 3, widths=(64, 128, 256), stem_width: int = 32,
                 drop_rate: float = 0.0, activation: str = "gelu", **kwargs):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation={activation!r} is not one of {', '.join(ACTIVATIONS)}")
        self.num_classes, self.num_features = num_classes, widths[-1]
        self.stem = nn.Sequential(nn.Conv2d(in_chans, stem_width, 2, stride=2, bias=False),
                                  nn.BatchNorm2d(stem_width), ACTIVATIONS[activation]())
        channels = [stem_width, *widths]
        self.groups = nn.Sequential(*[ConvGroup(a, b, activation) for a, b in zip(channels, channels[1:])])
        self.drop = nn.Dropout(drop_rate)
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.groups(self.stem(x))

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.drop(torch.amax(x, dim=(2, 3)))  # global max-pool: position-free, as in airbench
        return x if pre_logits else self.fc(x) * LOGIT_SCALE

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def get_classifier(self) -> nn.Module:
        return self.fc

    def reset_classifier(self, num_classes: int, **kwargs) -> None:
        self.num_classes = num_classes
        self.fc = nn.Linear(self.num_features, num_classes) if num_classes else nn.Identity()


def _speedrun(name: str, pretrained: bool, kwargs: dict, **sizes) -> SpeedrunResNet:
    if pretrained:
        raise ValueError(f"{name} has no pretrained weights; set pretrained=false")
    model = SpeedrunResNet(**{**sizes, **kwargs})
    model.pretrained_cfg = model.default_cfg = {
        "url": "", "num_classes": 1000, "input_size": (3, 64, 64), "pool_size": (4, 4), "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225), "first_conv": "stem.0", "classifier": "fc", "architecture": name}
    return model


@register_model
def speedrun_resnet(pretrained: bool = False, **kwargs) -> SpeedrunResNet:
    """Widths 64/128/256 (1.94 M parameters with 10 classes); no pretrained weights exist."""
    return _speedrun("speedrun_resnet", pretrained, kwargs, widths=(64, 128, 256))


@register_model
def speedrun_resnet_small(pretrained: bool = False, **kwargs) -> SpeedrunResNet:
    """Widths 32/64/128, stem 16 (0.49 M parameters with 10 classes): a quarter of the arithmetic."""
    return _speedrun("speedrun_resnet_small", pretrained, kwargs, widths=(32, 64, 128), stem_width=16)


@register_model
def speedrun_resnet_tiny(pretrained: bool = False, **kwargs) -> SpeedrunResNet:
    """Widths 16/32/64, stem 8 (0.12 M parameters with 10 classes): a quarter of the small net's
    arithmetic, the student notebook 13 distils the speed-run recipe's model into."""
    return _speedrun("speedrun_resnet_tiny", pretrained, kwargs, widths=(16, 32, 64), stem_width=8)
