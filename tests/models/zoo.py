"""The model suite: small models of the families users run, built locally with random weights.

Shared by the tests (`tests/models/`) and the benchmark (`benchmarks/bench_models.py`), so
both measure the same models. Each entry is a `ModelCase`: how to build the module, how to
make its inputs for a batch size and sequence length, and how to read one tensor out of
its output (what a loss is taken of).

- `transformers` decoders (Llama, Qwen2, Qwen3, Mistral, GPT-2), BERT and T5 at tiny
  configurations (hidden 64, 2 layers, 4 heads, vocabulary 512), eager attention
  implementation of transformers' choice (sdpa), no dropout;
- convolutional nets defined here: a ResNet-18-style stack (basic blocks, stride-2 stages
  with 1x1 downsampling), a MobileNetV3-style stack (inverted residuals, depthwise
  convolutions, squeeze-excite, hardswish), a 1-D convolution audio stack, and a ViT-style
  encoder (patch embedding, class token, pre-norm blocks).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 512
HIDDEN = 64


@dataclass(frozen=True)
class ModelCase:
    name: str
    #: Builds the module (weights drawn from torch's global generator: seed first).
    build: Callable[[], nn.Module]
    #: (model, batch, seq, mask) -> keyword inputs; `seq` is ignored by image models.
    inputs: Callable[[nn.Module, int, int, bool], dict[str, Any]]
    #: The tensor of the output that results are compared on and a loss is taken of.
    pick: Callable[[Any], torch.Tensor]
    #: Whether inputs have a sequence length (and attention masks make sense).
    sequence: bool = True
    #: Whether the model has a KV cache (`use_cache=True` with a `DynamicCache`).
    kv_cache: bool = False
    #: Default batch, sequence.
    shape: tuple[int, int] = (2, 16)
    tags: frozenset[str] = field(default_factory=frozenset)


# ---- transformers ----------------------------------------------------------------------------------
def _decoder_config(kind: str) -> Any:
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    if kind == "llama":
        return transformers.LlamaConfig(**common)
    if kind == "qwen2":
        return transformers.Qwen2Config(**common)
    if kind == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=16)
    if kind == "mistral":
        return transformers.MistralConfig(**common, sliding_window=None)
    raise ValueError(kind)


def _causal_lm(kind: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        if kind == "gpt2":
            cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=HIDDEN, n_layer=2, n_head=4,
                                          resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
            return transformers.GPT2LMHeadModel(cfg)
        return transformers.AutoModelForCausalLM.from_config(_decoder_config(kind))
    return build


def _bert() -> nn.Module:
    import transformers

    cfg = transformers.BertConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=2 * HIDDEN, max_position_embeddings=128,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return transformers.BertModel(cfg)


def _t5() -> nn.Module:
    import transformers

    cfg = transformers.T5Config(vocab_size=VOCAB, d_model=HIDDEN, d_kv=16, d_ff=2 * HIDDEN, num_layers=2,
                                num_decoder_layers=2, num_heads=4, dropout_rate=0.0, decoder_start_token_id=0)
    return transformers.T5ForConditionalGeneration(cfg)


def _mask(batch: int, seq: int) -> torch.Tensor:
    """Right padding: row k has its last k*2 positions masked (row 0 none)."""
    mask = torch.ones(batch, seq, dtype=torch.long)
    for k in range(1, batch):
        mask[k, seq - min(2 * k, seq - 1):] = 0
    return mask


def _ids(batch: int, seq: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _lm_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"input_ids": _ids(batch, seq, 1), "use_cache": False}
    if mask:
        kw["attention_mask"] = _mask(batch, seq)
    return kw


def _bert_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"input_ids": _ids(batch, seq, 1)}
    if mask:
        kw["attention_mask"] = _mask(batch, seq)
    return kw


def _t5_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"input_ids": _ids(batch, seq, 1), "decoder_input_ids": _ids(batch, max(seq // 2, 1), 2),
                          "use_cache": False}
    if mask:
        kw["attention_mask"] = _mask(batch, seq)
    return kw


def _logits(out: Any) -> torch.Tensor:
    return out.logits


def _hidden(out: Any) -> torch.Tensor:
    return out.last_hidden_state


# ---- convolutional and vision models ---------------------------------------------------------------
class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, a 1x1 projection when the
    shape changes, ReLU after the residual sum."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: Optional[nn.Module] = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet18ish(nn.Module):
    """ResNet-18's layout (stem, four stages of two basic blocks, pooling, linear) at width 8."""

    def __init__(self, width: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        blocks: list[nn.Module] = []
        cin = width
        for stage, mult in enumerate((1, 2, 4, 8)):
            cout = width * mult
            blocks += [BasicBlock(cin, cout, 1 if stage == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c: int, squeeze: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(s))))


class InvertedResidual(nn.Module):
    """MobileNetV3's block: 1x1 expansion, depthwise kxk, squeeze-excite, 1x1 projection;
    hardswish or ReLU; a residual when the shape is kept."""

    def __init__(self, cin: int, expand: int, cout: int, k: int, stride: int, se: bool, hs: bool) -> None:
        super().__init__()
        act: type[nn.Module] = nn.Hardswish if hs else nn.ReLU
        layers: list[nn.Module] = []
        if expand != cin:
            layers += [nn.Conv2d(cin, expand, 1, bias=False), nn.BatchNorm2d(expand), act()]
        layers += [nn.Conv2d(expand, expand, k, stride, k // 2, groups=expand, bias=False), nn.BatchNorm2d(expand),
                   act()]
        if se:
            layers.append(SqueezeExcite(expand, max(expand // 4, 8)))
        layers += [nn.Conv2d(expand, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.residual else y


class MobileNetV3ish(nn.Module):
    """MobileNetV3-Small's first blocks, narrow: stem with hardswish, inverted residuals with
    and without squeeze-excite, head of 1x1 conv, pooling and a linear layer with hardswish."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.blocks = nn.Sequential(
            InvertedResidual(16, 16, 16, 3, 2, se=True, hs=False),
            InvertedResidual(16, 48, 24, 3, 2, se=False, hs=False),
            InvertedResidual(24, 64, 24, 3, 1, se=False, hs=False),
            InvertedResidual(24, 72, 32, 5, 2, se=True, hs=True),
            InvertedResidual(32, 96, 32, 5, 1, se=True, hs=True),
        )
        self.head = nn.Sequential(nn.Conv2d(32, 96, 1, bias=False), nn.BatchNorm2d(96), nn.Hardswish())
        self.fc = nn.Sequential(nn.Linear(96, 128), nn.Hardswish(), nn.Linear(128, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class AudioConv1d(nn.Module):
    """A wav2vec-style feature stack: strided 1-D convolutions with group norm and GELU, then
    pointwise and depthwise 1-D convolutions with batch norm, and a per-frame classifier."""

    def __init__(self, classes: int = 12) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 32, 10, 5, bias=False), nn.GroupNorm(32, 32), nn.GELU(),
            nn.Conv1d(32, 32, 3, 2, bias=False), nn.GELU(),
            nn.Conv1d(32, 32, 3, 2, bias=False), nn.GELU(),
        )
        self.mix = nn.Sequential(
            nn.Conv1d(32, 64, 1), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 64, 5, padding=2, groups=64), nn.BatchNorm1d(64), nn.ReLU(),
            nn.Conv1d(64, 32, 1),
        )
        self.out = nn.Linear(32, classes)

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        h = self.features(wave)
        h = h + self.mix(h)
        return self.out(h.transpose(1, 2))


class ViTBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class ViTish(nn.Module):
    """A ViT encoder: 4x4 patches of a 32x32 image, class token, learned positions, two
    pre-norm blocks, classification from the class token."""

    def __init__(self, dim: int = HIDDEN, heads: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, 65, dim))
        self.blocks = nn.Sequential(ViTBlock(dim, heads), ViTBlock(dim, heads))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls.expand(x.shape[0], -1, -1), x), dim=1) + self.pos
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def _image(size: int) -> Callable[[nn.Module, int, int, bool], dict[str, Any]]:
    def inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
        return {"x": torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(3))}
    return inputs


def _wave(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    return {"wave": torch.randn(batch, 1, seq, generator=torch.Generator().manual_seed(4))}


def _same(out: Any) -> torch.Tensor:
    return out


TRANSFORMERS = ("llama", "qwen2", "qwen3", "mistral", "gpt2", "bert", "t5")

CASES: dict[str, ModelCase] = {
    **{k: ModelCase(k, _causal_lm(k), _lm_inputs, _logits, kv_cache=True) for k in ("llama", "qwen2", "qwen3",
                                                                                 "mistral", "gpt2")},
    "bert": ModelCase("bert", _bert, _bert_inputs, _hidden),
    "t5": ModelCase("t5", _t5, _t5_inputs, _logits),
    "resnet18": ModelCase("resnet18", ResNet18ish, _image(32), _same, sequence=False, shape=(2, 0)),
    "mobilenetv3": ModelCase("mobilenetv3", MobileNetV3ish, _image(32), _same, sequence=False, shape=(2, 0)),
    "audio1d": ModelCase("audio1d", AudioConv1d, _wave, _same, shape=(2, 800)),
    "vit": ModelCase("vit", ViTish, _image(32), _same, sequence=False, shape=(2, 0)),
}


def build(name: str, seed: int = 0) -> nn.Module:
    """The model `name` with weights from `seed`, in eval mode."""
    torch.manual_seed(seed)
    return CASES[name].build().eval()
