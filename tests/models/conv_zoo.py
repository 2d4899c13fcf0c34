"""Convolution networks from `torch.nn` (no torchvision), random weights: the suite issue 35
measures (`benchmarks/bench_conv.py`) and CI keeps compiling (`tests/models/test_conv_models.py`).

Each model has two sizes, built by `build(name, size)` with inputs from `inputs(name, size, batch)`:

- `full`: the real layout at a realistic size (224x224 images for the ImageNet models, 32x32 for
  the CIFAR-style classes, 128x128 for the U-Net, one second of 16 kHz audio);
- `tiny`: the same building blocks, few of them, narrow, on small inputs, so that compiling and
  running a forward and a training step costs a CI test a few CPU-seconds.

The models, by class:

- `resnet_blocks`: ResNet basic blocks with batch norm (3x3 and 1x1 convolutions; CIFAR's
  ResNet-20 at full size, 32x32 images);
- `audio_encoder`: a 1-D audio encoder (strided conv1d with kernels 3-10, group norm, GELU,
  pointwise and depthwise conv1d with batch norm; `zoo.AudioConv1d`);
- `mobilenet_blocks`: MobileNet-style inverted residuals (depthwise 3x3/5x5, squeeze-excite,
  hardswish; `zoo.MobileNetV3ish` at full size, 32x32 images);
- `small_cnn`: conv, batch norm, ReLU, max pool, linear (32x32 images);
- `resnet18`, `resnet50`: torchvision's ResNet layouts (7x7 stem, max pool, basic or
  bottleneck blocks, stride on the 3x3 as in v1.5);
- `mobilenetv3_small`, `mobilenetv3_large`: torchvision's MobileNetV3 block tables;
- `efficientnet_b0`: MBConv blocks (expansion, depthwise, squeeze-excite, SiLU), stochastic
  depth and dropout off;
- `convnext_t`: ConvNeXt-T (depthwise 7x7, layer norm over channels, GELU, layer scale);
- `wav2vec2_features`: wav2vec2's feature encoder (seven conv1d layers of 512 channels,
  group norm on the first, GELU);
- `unet`: a small U-Net (group norm, SiLU, skip concatenations; upsampling by nearest
  interpolation and a convolution at one level, a transposed convolution at the others);
- `vgg11_bn`: VGG-11 with batch norm (a pooled 512-wide classifier, not VGG's 4096-wide one);
- `conv3d`: a small 3-D convolution net over video clips (conv3d, batch norm, max pool).

No model has dropout or stochastic depth, so a training step computes the same thing twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.models.zoo import AudioConv1d, BasicBlock, InvertedResidual, MobileNetV3ish

SIZES = ("full", "tiny")


def _divisible(v: float, divisor: int = 8) -> int:
    """`v` rounded to a multiple of `divisor`, not below 90% of `v` (MobileNet's channel rule)."""
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def _scaled(mult: float) -> Callable[[int], int]:
    """A channel count of the reference table times `mult`, kept divisible by 8."""
    def channels(v: int) -> int:
        return _divisible(v * mult)
    return channels


def _head(cin: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes))


# ---- ResNet --------------------------------------------------------------------------------------
class BasicBlockStack(nn.Module):
    """CIFAR's ResNet: a 3x3 stem, stages of `zoo.BasicBlock`s (the first of each later stage
    strided, with a 1x1 projection), global pooling, a linear classifier."""

    def __init__(self, widths: Sequence[int], blocks: int, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU())
        layers: list[nn.Module] = []
        cin = widths[0]
        for stage, w in enumerate(widths):
            for b in range(blocks):
                layers.append(BasicBlock(cin, w, 2 if stage > 0 and b == 0 else 1))
                cin = w
        self.blocks = nn.Sequential(*layers)
        self.head = _head(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3 (strided, torchvision's v1.5), 1x1 expand by 4, batch
    norm after each, a 1x1 projection when the shape changes, ReLU after the sum."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down: Optional[nn.Module] = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """torchvision's ResNet: 7x7/2 stem with batch norm and ReLU, 3x3/2 max pool, four stages
    (widths w, 2w, 4w, 8w; the first block of stages 2-4 strided), average pool, linear."""

    def __init__(self, bottleneck: bool, depths: Sequence[int], width: int = 64, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, 2, 3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        cin = width
        for stage, n in enumerate(depths):
            w = width * 2 ** stage
            for b in range(n):
                stride = 2 if stage > 0 and b == 0 else 1
                if bottleneck:
                    layers.append(Bottleneck(cin, w, stride))
                    cin = w * Bottleneck.expansion
                else:
                    layers.append(BasicBlock(cin, w, stride))
                    cin = w
        self.layers = nn.Sequential(*layers)
        self.head = _head(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)))


# ---- MobileNetV3, EfficientNet ---------------------------------------------------------------------
#: torchvision's tables: (input, kernel, expanded, output, squeeze-excite, hardswish, stride).
MNV3_LARGE = [
    (16, 3, 16, 16, False, False, 1), (16, 3, 64, 24, False, False, 2), (24, 3, 72, 24, False, False, 1),
    (24, 5, 72, 40, True, False, 2), (40, 5, 120, 40, True, False, 1), (40, 5, 120, 40, True, False, 1),
    (40, 3, 240, 80, False, True, 2), (80, 3, 200, 80, False, True, 1), (80, 3, 184, 80, False, True, 1),
    (80, 3, 184, 80, False, True, 1), (80, 3, 480, 112, True, True, 1), (112, 3, 672, 112, True, True, 1),
    (112, 5, 672, 160, True, True, 2), (160, 5, 960, 160, True, True, 1), (160, 5, 960, 160, True, True, 1),
]
MNV3_SMALL = [
    (16, 3, 16, 16, True, False, 2), (16, 3, 72, 24, False, False, 2), (24, 3, 88, 24, False, False, 1),
    (24, 5, 96, 40, True, True, 2), (40, 5, 240, 40, True, True, 1), (40, 5, 240, 40, True, True, 1),
    (40, 5, 120, 48, True, True, 1), (48, 5, 144, 48, True, True, 1), (48, 5, 288, 96, True, True, 2),
    (96, 5, 576, 96, True, True, 1), (96, 5, 576, 96, True, True, 1),
]


class MobileNetV3(nn.Module):
    """MobileNetV3 from a block table: 3x3/2 stem with hardswish, `zoo.InvertedResidual`s, a
    1x1 head convolution (6x the last block's width), pooling, linear-hardswish-linear. Channel
    counts are the table's times `mult` (kept divisible by 8); the squeeze-excite width is
    `zoo.InvertedResidual`'s (a quarter, at least 8; torchvision rounds it to a multiple of 8)."""

    def __init__(self, table: Sequence[tuple[int, int, int, int, bool, bool, int]], last: int, mult: float = 1.0,
                 classes: int = 1000) -> None:
        super().__init__()
        c = _scaled(mult)
        stem = c(table[0][0])
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 3, 2, 1, bias=False), nn.BatchNorm2d(stem), nn.Hardswish())
        blocks = []
        for cin, k, exp, cout, se, hs, stride in table:
            blocks.append(InvertedResidual(c(cin), c(exp), c(cout), k, stride, se=se, hs=hs))
        self.blocks = nn.Sequential(*blocks)
        width = 6 * c(table[-1][3])
        self.conv = nn.Sequential(nn.Conv2d(c(table[-1][3]), width, 1, bias=False), nn.BatchNorm2d(width),
                                  nn.Hardswish())
        last = c(last)
        self.fc = nn.Sequential(nn.Linear(width, last), nn.Hardswish(), nn.Linear(last, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class MBConv(nn.Module):
    """EfficientNet's block: 1x1 expansion (unless the ratio is 1), depthwise kxk, squeeze-excite
    (SiLU, sigmoid; a quarter of the block's input width), 1x1 projection; batch norm after each
    convolution, SiLU after all but the projection; a residual when the shape is kept."""

    def __init__(self, cin: int, cout: int, ratio: int, k: int, stride: int) -> None:
        super().__init__()
        exp = cin * ratio
        layers: list[nn.Module] = []
        if ratio != 1:
            layers += [nn.Conv2d(cin, exp, 1, bias=False), nn.BatchNorm2d(exp), nn.SiLU()]
        layers += [nn.Conv2d(exp, exp, k, stride, k // 2, groups=exp, bias=False), nn.BatchNorm2d(exp), nn.SiLU()]
        self.body = nn.Sequential(*layers)
        squeeze = max(1, cin // 4)
        self.se1 = nn.Conv2d(exp, squeeze, 1)
        self.se2 = nn.Conv2d(squeeze, exp, 1)
        self.project = nn.Sequential(nn.Conv2d(exp, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        s = torch.sigmoid(self.se2(F.silu(self.se1(F.adaptive_avg_pool2d(h, 1)))))
        y = self.project(h * s)
        return x + y if self.residual else y


#: EfficientNet-B0's stages: (expansion, kernel, stride, input, output, blocks).
EFFNET_B0 = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
             (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]


class EfficientNet(nn.Module):
    """EfficientNet: 3x3/2 stem (batch norm, SiLU), MBConv stages, 1x1 head convolution to 4x
    the last width (1280 at B0), pooling, linear (dropout off). Widths times `mult`."""

    def __init__(self, stages: Sequence[tuple[int, int, int, int, int, int]], mult: float = 1.0,
                 classes: int = 1000) -> None:
        super().__init__()
        c = _scaled(mult)
        stem = c(stages[0][3])
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 3, 2, 1, bias=False), nn.BatchNorm2d(stem), nn.SiLU())
        blocks = []
        for ratio, k, stride, cin, cout, n in stages:
            for b in range(n):
                blocks.append(MBConv(c(cin) if b == 0 else c(cout), c(cout), ratio, k, stride if b == 0 else 1))
        self.blocks = nn.Sequential(*blocks)
        head = 4 * c(stages[-1][4])
        self.conv = nn.Sequential(nn.Conv2d(c(stages[-1][4]), head, 1, bias=False), nn.BatchNorm2d(head), nn.SiLU())
        self.head = _head(head, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(self.blocks(self.stem(x))))


# ---- ConvNeXt ------------------------------------------------------------------------------------
class LayerNorm2d(nn.LayerNorm):
    """Layer norm over the channels of an NCHW tensor (torchvision's: permute, norm, permute)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvNeXtBlock(nn.Module):
    """Depthwise 7x7, then channels-last: layer norm, linear 4x, GELU, linear back, times a
    learned per-channel layer scale; a residual."""

    def __init__(self, dim: int, layer_scale: float) -> None:
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.dw(x).permute(0, 2, 3, 1)
        h = self.fc2(F.gelu(self.fc1(self.norm(h)))) * self.gamma
        return x + h.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt: 4x4/4 stem with channel layer norm; stages of blocks with a channel layer norm
    and a 2x2/2 convolution between them; pooling, layer norm, linear."""

    def __init__(self, dims: Sequence[int], depths: Sequence[int], layer_scale: float = 1e-6,
                 classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6))
        stages: list[nn.Module] = []
        for i, (dim, depth) in enumerate(zip(dims, depths)):
            if i > 0:
                stages += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            stages += [ConvNeXtBlock(dim, layer_scale) for _ in range(depth)]
        self.stages = nn.Sequential(*stages)
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.fc = nn.Linear(dims[-1], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(self.norm(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)))


# ---- audio -----------------------------------------------------------------------------------------
#: wav2vec2's feature encoder: (channels, kernel, stride) of its seven layers.
WAV2VEC2_LAYERS = [(512, 10, 5)] + [(512, 3, 2)] * 4 + [(512, 2, 2)] * 2


class Wav2Vec2Features(nn.Module):
    """wav2vec2's convolutional feature encoder ("group norm" mode): conv1d layers without bias,
    group norm with one group per channel on the first, GELU after each; then the frames."""

    def __init__(self, layers: Sequence[tuple[int, int, int]]) -> None:
        super().__init__()
        convs: list[nn.Module] = []
        cin = 1
        for i, (cout, k, stride) in enumerate(layers):
            convs.append(nn.Conv1d(cin, cout, k, stride, bias=False))
            if i == 0:
                convs.append(nn.GroupNorm(cout, cout))
            convs.append(nn.GELU())
            cin = cout
        self.convs = nn.Sequential(*convs)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        return self.convs(wave).transpose(1, 2)


# ---- U-Net -----------------------------------------------------------------------------------------
class ConvGN(nn.Sequential):
    """Two 3x3 convolutions, each followed by group norm and SiLU."""

    def __init__(self, cin: int, cout: int, groups: int) -> None:
        super().__init__(nn.Conv2d(cin, cout, 3, padding=1), nn.GroupNorm(groups, cout), nn.SiLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.GroupNorm(groups, cout), nn.SiLU())


class Up(nn.Module):
    """Doubles the resolution, by nearest interpolation and a 3x3 convolution or by a 2x2/2
    transposed convolution; concatenates the skip; two convolutions."""

    def __init__(self, cin: int, cout: int, groups: int, transposed: bool) -> None:
        super().__init__()
        self.transposed = transposed
        self.up = nn.ConvTranspose2d(cin, cout, 2, 2) if transposed else nn.Conv2d(cin, cout, 3, padding=1)
        self.conv = ConvGN(2 * cout, cout, groups)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = self.up(x) if self.transposed else self.up(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return self.conv(torch.cat([x, skip], dim=1))


class UNet(nn.Module):
    """A U-Net: per level two convolutions with group norm and SiLU, down by 2x2 max pooling,
    up by `Up` (interpolation at the top level, transposed convolutions below) with the level's
    skip concatenated; a 1x1 output convolution."""

    def __init__(self, widths: Sequence[int], groups: int, cin: int = 3, cout: int = 3) -> None:
        super().__init__()
        self.down = nn.ModuleList()
        c = cin
        for w in widths[:-1]:
            self.down.append(ConvGN(c, w, groups))
            c = w
        self.mid = ConvGN(c, widths[-1], groups)
        self.up = nn.ModuleList(Up(widths[i + 1], widths[i], groups, transposed=i > 0)
                                for i in reversed(range(len(widths) - 1)))
        self.out = nn.Conv2d(widths[0], cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = []
        for block in self.down:
            x = block(x)
            skips.append(x)
            x = F.max_pool2d(x, 2)
        x = self.mid(x)
        for up, skip in zip(self.up, reversed(skips)):
            x = up(x, skip)
        return self.out(x)


# ---- VGG, small CNN, 3-D -----------------------------------------------------------------------------
VGG11 = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


class VGG(nn.Module):
    """VGG with batch norm: 3x3 convolutions (batch norm, ReLU) and 2x2 max pools from a table;
    global average pooling and a two-layer classifier of the last width (VGG's own 4096-wide
    classifier on 7x7 features is a GEMM benchmark, not a convolution one)."""

    def __init__(self, table: Sequence[Any], mult: float = 1.0, classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for v in table:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                w = max(4, int(v * mult))
                layers += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU()]
                c = w
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, c), nn.ReLU(),
                                        nn.Linear(c, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class SmallCNN(nn.Module):
    """A small image classifier: stages of 3x3 convolution, batch norm, ReLU and 2x2 max
    pooling, then flatten and a linear layer."""

    def __init__(self, widths: Sequence[int], image: int, classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        c = 3
        for w in widths:
            layers += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2)]
            c = w
        self.features = nn.Sequential(*layers)
        side = image // 2 ** len(widths)
        self.fc = nn.Linear(c * side * side, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


class Conv3dNet(nn.Module):
    """A 3-D convolution net over clips (batch, channels, frames, height, width): 3x3x3
    convolutions with batch norm and ReLU, a 1x2x2 then 2x2x2 max pool, a strided convolution,
    global pooling and a linear layer."""

    def __init__(self, widths: Sequence[int], classes: int = 10) -> None:
        super().__init__()
        a, b, c = widths
        self.body = nn.Sequential(
            nn.Conv3d(3, a, 3, padding=1, bias=False), nn.BatchNorm3d(a), nn.ReLU(), nn.MaxPool3d((1, 2, 2)),
            nn.Conv3d(a, b, 3, padding=1, bias=False), nn.BatchNorm3d(b), nn.ReLU(), nn.MaxPool3d(2),
            nn.Conv3d(b, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm3d(c), nn.ReLU(),
        )
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.adaptive_avg_pool3d(self.body(x), 1), 1))


# ---- the suite ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvCase:
    """One model: its two builds, the shape of one input sample at each size, and the name of
    its forward's argument."""

    name: str
    #: What it is, for tables.
    what: str
    full: Callable[[], nn.Module]
    tiny: Callable[[], nn.Module]
    #: One sample's shape (no batch dimension) at full and tiny size.
    sample: dict[str, tuple[int, ...]]
    arg: str = "x"

    def pick(self, out: Any) -> torch.Tensor:
        """The output tensor (every model here returns one)."""
        return out


def _case(name: str, what: str, full: Callable[[], nn.Module], tiny: Callable[[], nn.Module],
          full_sample: tuple[int, ...], tiny_sample: tuple[int, ...], arg: str = "x") -> ConvCase:
    return ConvCase(name, what, full, tiny, {"full": full_sample, "tiny": tiny_sample}, arg)


_TINY_MNV3_SMALL = [MNV3_SMALL[i] for i in (2, 3)]
_TINY_MNV3_LARGE = [MNV3_LARGE[i] for i in (4, 6)]
_TINY_EFFNET = [(1, 3, 1, 16, 16, 1), (6, 5, 2, 16, 24, 1)]
_TINY_MNV3ISH = [(16, 3, 16, 24, True, False, 2), (24, 5, 48, 24, False, True, 1)]
_TINY_WAV2VEC2 = [(32, 10, 5), (32, 3, 2), (32, 2, 2)]

CASES: dict[str, ConvCase] = {c.name: c for c in [
    _case("resnet_blocks", "ResNet basic blocks, batch norm (ResNet-20, 32x32)",
          lambda: BasicBlockStack((16, 32, 64), 3), lambda: BasicBlockStack((4, 8), 1), (3, 32, 32), (3, 8, 8)),
    _case("audio_encoder", "1-D audio encoder: strided conv1d, group norm, GELU (1 s at 16 kHz)",
          AudioConv1d, AudioConv1d, (1, 16000), (1, 400), arg="wave"),
    _case("mobilenet_blocks", "MobileNet-style: depthwise, squeeze-excite, hardswish (32x32)",
          MobileNetV3ish, lambda: MobileNetV3(_TINY_MNV3ISH, 32, classes=10), (3, 32, 32), (3, 16, 16)),
    _case("small_cnn", "small CNN: conv, batch norm, ReLU, max pool, linear (32x32)",
          lambda: SmallCNN((32, 64, 128), 32), lambda: SmallCNN((4, 8), 8), (3, 32, 32), (3, 8, 8)),
    _case("resnet18", "ResNet-18 (torchvision layout, 224x224)",
          lambda: ResNet(False, (2, 2, 2, 2)), lambda: ResNet(False, (1, 1), width=4, classes=10),
          (3, 224, 224), (3, 16, 16)),
    _case("resnet50", "ResNet-50 (torchvision layout, 224x224)",
          lambda: ResNet(True, (3, 4, 6, 3)), lambda: ResNet(True, (1, 1), width=4, classes=10),
          (3, 224, 224), (3, 16, 16)),
    _case("mobilenetv3_small", "MobileNetV3-Small (224x224)",
          lambda: MobileNetV3(MNV3_SMALL, 1024), lambda: MobileNetV3(_TINY_MNV3_SMALL, 1024, 0.25, classes=10),
          (3, 224, 224), (3, 16, 16)),
    _case("mobilenetv3_large", "MobileNetV3-Large (224x224)",
          lambda: MobileNetV3(MNV3_LARGE, 1280), lambda: MobileNetV3(_TINY_MNV3_LARGE, 1280, 0.25, classes=10),
          (3, 224, 224), (3, 16, 16)),
    _case("efficientnet_b0", "EfficientNet-B0: MBConv, SiLU, squeeze-excite (224x224)",
          lambda: EfficientNet(EFFNET_B0), lambda: EfficientNet(_TINY_EFFNET, 0.25, classes=10),
          (3, 224, 224), (3, 16, 16)),
    _case("convnext_t", "ConvNeXt-T: depthwise 7x7, channel layer norm, GELU, layer scale (224x224)",
          lambda: ConvNeXt((96, 192, 384, 768), (3, 3, 9, 3)),
          lambda: ConvNeXt((8, 16), (1, 1), layer_scale=0.5, classes=10), (3, 224, 224), (3, 16, 16)),
    _case("wav2vec2_features", "wav2vec2 feature encoder: 7 conv1d x 512, group norm, GELU (1 s at 16 kHz)",
          lambda: Wav2Vec2Features(WAV2VEC2_LAYERS), lambda: Wav2Vec2Features(_TINY_WAV2VEC2),
          (1, 16000), (1, 200), arg="wave"),
    _case("unet", "U-Net: group norm, SiLU, skip concatenations, interpolate/transposed conv (128x128)",
          lambda: UNet((32, 64, 128, 256), 8), lambda: UNet((4, 8, 16), 2), (3, 128, 128), (3, 8, 8)),
    _case("vgg11_bn", "VGG-11 with batch norm (224x224)",
          lambda: VGG(VGG11), lambda: VGG([8, "M", 16, 16, "M"], classes=10), (3, 224, 224), (3, 8, 8)),
    _case("conv3d", "3-D conv net: conv3d, batch norm, max pool (16 frames of 112x112)",
          lambda: Conv3dNet((32, 64, 128)), lambda: Conv3dNet((4, 8, 8)), (3, 16, 112, 112), (3, 4, 16, 16)),
]}


def build(name: str, size: str = "full", seed: int = 0) -> nn.Module:
    """The model `name` at `size` ("full" or "tiny") with weights from `seed`, in eval mode."""
    if name not in CASES:
        raise ValueError(f"unknown convolution model {name!r}; known: {', '.join(CASES)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; expected one of {', '.join(SIZES)}")
    torch.manual_seed(seed)
    case = CASES[name]
    return (case.full if size == "full" else case.tiny)().eval()


def inputs(name: str, size: str = "full", batch: int = 1, seed: int = 3) -> dict[str, torch.Tensor]:
    """Keyword inputs of `name`'s forward: a batch of random samples at `size`."""
    case = CASES[name]
    shape = (batch, *case.sample[size])
    return {case.arg: torch.randn(shape, generator=torch.Generator().manual_seed(seed))}
