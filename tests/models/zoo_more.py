"""More models: architectures outside the main suite (`zoo.py`), swept by
`tools/sweep_models.py` and, a compact set, kept working by `tests/models/test_more_models.py`.

- `transformers` models at tiny configurations (hidden 64, 2 layers, 4 heads, vocabulary 512,
  dropout off, random weights; nothing is downloaded): decoders (Phi, Phi-3, Gemma 1/2/3,
  GPT-NeoX, GPT-J, OPT, Falcon, Bloom, StableLM, Starcoder2, OLMo 1/2, Granite), encoders
  (DistilBERT, RoBERTa, ALBERT, ELECTRA, DeBERTa-v2, MPNet), encoder-decoders (BART, Whisper),
  vision (ViT, DeiT, Swin, ConvNeXt, ResNet, MobileViT, CLIP's vision tower), CLIP's text tower,
  audio (Wav2Vec2, HuBERT);
- small `torch.nn` models defined here, each exercising a family of ops the transformers
  models do not: recurrent layers, embedding bags, unusual convolutions and resampling,
  normalizations, padded attention, sequence ops (cumsum, top-k, sort, scatter/gather),
  masking, einsum, slicing, in-place updates, half-precision casts, integer arithmetic.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.models.zoo import HIDDEN, VOCAB, ModelCase, _hidden, _ids, _logits, _mask, _same

# ---- transformers decoders -------------------------------------------------------------------------
_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
               num_attention_heads=4, max_position_embeddings=128)


def _decoder_config(kind: str) -> Any:
    import transformers as t

    kv = dict(num_key_value_heads=2)
    if kind == "phi":
        return t.PhiConfig(**_COMMON, partial_rotary_factor=0.5, resid_pdrop=0.0, embd_pdrop=0.0)
    if kind == "phi3":
        return t.Phi3Config(**_COMMON, **kv, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if kind == "gemma":
        return t.GemmaConfig(**_COMMON, **kv, head_dim=16, pad_token_id=0)
    if kind == "gemma2":
        return t.Gemma2Config(**_COMMON, **kv, head_dim=16, pad_token_id=0, sliding_window=8)
    if kind == "gemma3":
        return t.Gemma3TextConfig(**_COMMON, **kv, head_dim=16, pad_token_id=0, sliding_window=8)
    if kind == "gpt_neox":
        return t.GPTNeoXConfig(**_COMMON, rotary_pct=0.25, hidden_dropout=0.0, attention_dropout=0.0)
    if kind == "gptj":
        return t.GPTJConfig(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=4, rotary_dim=8, n_positions=128,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    if kind == "opt":
        return t.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, ffn_dim=2 * HIDDEN, num_hidden_layers=2,
                           num_attention_heads=4, word_embed_proj_dim=HIDDEN, max_position_embeddings=128,
                           dropout=0.0, attention_dropout=0.0, pad_token_id=1)
    if kind == "falcon":
        return t.FalconConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                              hidden_dropout=0.0, attention_dropout=0.0)
    if kind == "bloom":
        return t.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=2, n_head=4, hidden_dropout=0.0,
                             attention_dropout=0.0)
    if kind == "stablelm":
        return t.StableLmConfig(**_COMMON, **kv, partial_rotary_factor=0.25)
    if kind == "starcoder2":
        return t.Starcoder2Config(**_COMMON, **kv, sliding_window=None, residual_dropout=0.0, embedding_dropout=0.0)
    if kind == "olmo":
        return t.OlmoConfig(**_COMMON, **kv, pad_token_id=0)
    if kind == "olmo2":
        return t.Olmo2Config(**_COMMON, **kv, pad_token_id=0)
    if kind == "granite":
        return t.GraniteConfig(**_COMMON, **kv, embedding_multiplier=2.0, residual_multiplier=0.5,
                               logits_scaling=4.0, attention_multiplier=0.25)
    raise ValueError(kind)


def _causal_lm(kind: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        return transformers.AutoModelForCausalLM.from_config(_decoder_config(kind))
    return build


def _lm_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"input_ids": _ids(batch, seq, 1), "use_cache": False}
    if mask:
        kw["attention_mask"] = _mask(batch, seq)
    return kw


DECODERS = ("phi", "phi3", "gemma", "gemma2", "gemma3", "gpt_neox", "gptj", "opt", "falcon", "bloom", "stablelm",
            "starcoder2", "olmo", "olmo2", "granite")


# ---- transformers encoders and encoder-decoders ----------------------------------------------------
_BERTISH = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=2 * HIDDEN, max_position_embeddings=130, hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0)


def _encoder(kind: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers as t

        if kind == "distilbert":
            return t.DistilBertModel(t.DistilBertConfig(vocab_size=VOCAB, dim=HIDDEN, n_layers=2, n_heads=4,
                                                        hidden_dim=2 * HIDDEN, dropout=0.0, attention_dropout=0.0,
                                                        max_position_embeddings=128))
        if kind == "roberta":
            return t.RobertaModel(t.RobertaConfig(**_BERTISH, pad_token_id=1))
        if kind == "albert":
            return t.AlbertModel(t.AlbertConfig(**_BERTISH, embedding_size=32, classifier_dropout_prob=0.0))
        if kind == "electra":
            return t.ElectraModel(t.ElectraConfig(**_BERTISH, embedding_size=32))
        if kind == "deberta_v2":
            return t.DebertaV2Model(t.DebertaV2Config(**_BERTISH, relative_attention=True, position_buckets=16,
                                                      max_relative_positions=32, pos_att_type=["p2c", "c2p"],
                                                      position_biased_input=False))
        if kind == "mpnet":
            return t.MPNetModel(t.MPNetConfig(**_BERTISH, pad_token_id=1, relative_attention_num_buckets=32))
        if kind == "clip_text":
            return t.CLIPTextModel(t.CLIPTextConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                                                    num_hidden_layers=2, num_attention_heads=4,
                                                    max_position_embeddings=64, eos_token_id=2))
        raise ValueError(kind)
    return build


def _encoder_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"input_ids": _ids(batch, seq, 1)}
    if mask:
        kw["attention_mask"] = _mask(batch, seq)
    return kw


ENCODERS = ("distilbert", "roberta", "albert", "electra", "deberta_v2", "mpnet", "clip_text")


def _bart() -> nn.Module:
    import transformers as t

    cfg = t.BartConfig(vocab_size=VOCAB, d_model=HIDDEN, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                       decoder_attention_heads=4, encoder_ffn_dim=2 * HIDDEN, decoder_ffn_dim=2 * HIDDEN,
                       max_position_embeddings=128, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    return t.BartForConditionalGeneration(cfg)


def _bart_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    kw: dict[str, Any] = {"input_ids": _ids(batch, seq, 1), "decoder_input_ids": _ids(batch, max(seq // 2, 1), 2),
                          "use_cache": False}
    if mask:
        kw["attention_mask"] = _mask(batch, seq)
    return kw


_MELS = 16
_FRAMES = 32


def _whisper() -> nn.Module:
    import transformers as t

    cfg = t.WhisperConfig(vocab_size=VOCAB, num_mel_bins=_MELS, d_model=HIDDEN, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * HIDDEN,
                          decoder_ffn_dim=2 * HIDDEN, max_source_positions=_FRAMES // 2, max_target_positions=64,
                          dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return t.WhisperForConditionalGeneration(cfg)


def _whisper_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {"input_features": torch.randn(batch, _MELS, _FRAMES, generator=g),
            "decoder_input_ids": _ids(batch, max(seq // 2, 1), 2), "use_cache": False}


# ---- transformers vision and audio -----------------------------------------------------------------
_VIT = dict(image_size=32, patch_size=4, num_channels=3, hidden_size=HIDDEN, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=2 * HIDDEN, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)


def _vision(kind: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers as t

        if kind == "hf_vit":
            return t.ViTModel(t.ViTConfig(**_VIT), add_pooling_layer=False)
        if kind == "deit":
            return t.DeiTModel(t.DeiTConfig(**_VIT), add_pooling_layer=False)
        if kind == "swin":
            return t.SwinModel(t.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                            window_size=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                                            drop_path_rate=0.0))
        if kind == "convnext":
            return t.ConvNextModel(t.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2,
                                                    drop_path_rate=0.0))
        if kind == "hf_resnet":
            return t.ResNetModel(t.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                                                layer_type="basic"))
        if kind == "mobilevit":
            return t.MobileViTModel(t.MobileViTConfig(image_size=32, patch_size=2, hidden_sizes=[32, 48, 64],
                                                      neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                                      num_attention_heads=2, hidden_dropout_prob=0.0,
                                                      attention_probs_dropout_prob=0.0))
        if kind == "clip_vision":
            return t.CLIPVisionModel(t.CLIPVisionConfig(image_size=32, patch_size=4, hidden_size=HIDDEN,
                                                        intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                                                        num_attention_heads=4))
        raise ValueError(kind)
    return build


def _pixels(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    return {"pixel_values": torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(3))}


VISION = ("hf_vit", "deit", "swin", "convnext", "hf_resnet", "mobilevit", "clip_vision")


def _audio(kind: str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers as t

        common = dict(vocab_size=32, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=2 * HIDDEN, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3),
                      num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, hidden_dropout=0.0,
                      attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
                      layerdrop=0.0, mask_time_prob=0.0, mask_feature_prob=0.0)
        if kind == "wav2vec2":
            return t.Wav2Vec2Model(t.Wav2Vec2Config(**common))
        if kind == "hubert":
            return t.HubertModel(t.HubertConfig(**common))
        raise ValueError(kind)
    return build


def _wave(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    return {"input_values": torch.randn(batch, 800, generator=torch.Generator().manual_seed(4))}


AUDIO = ("wav2vec2", "hubert")


# ---- small torch.nn models -------------------------------------------------------------------------
class Recurrent(nn.Module):
    """Embedding, a two-layer LSTM, a bidirectional GRU, a classifier per step."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True)
        self.gru = nn.GRU(24, 16, batch_first=True, bidirectional=True)
        self.out = nn.Linear(32, 8)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.emb(input_ids))
        h, _ = self.gru(h)
        return self.out(h)


class Bags(nn.Module):
    """Embedding bags over offsets (sum with per-sample weights, mean, max) into an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.sum = nn.EmbeddingBag(VOCAB, 16, mode="sum")
        self.mean = nn.EmbeddingBag(VOCAB, 16, mode="mean")
        self.max = nn.EmbeddingBag(VOCAB, 16, mode="max")
        self.mlp = nn.Sequential(nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        feats = torch.cat([self.sum(ids, offsets, per_sample_weights=weights), self.mean(ids, offsets),
                           self.max(ids, offsets)], dim=1)
        return self.mlp(feats)


def _bag_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(5)
    n = batch * seq
    return {"ids": torch.randint(0, VOCAB, (n,), generator=g),
            "offsets": torch.tensor([0] + [seq * k - 3 * (k % 2) for k in range(1, batch)]),
            "weights": torch.rand(n, generator=g)}


class ConvMix(nn.Module):
    """Grouped and dilated convolutions, a transposed convolution, nearest and bilinear
    upsampling, pixel shuffle/unshuffle, adaptive pooling to odd sizes, group, instance and
    channel layer norms, reflection padding."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=2, dilation=2)
        self.g1 = nn.GroupNorm(4, 16)
        self.c2 = nn.Conv2d(16, 16, 3, stride=2, padding=1, groups=4)
        self.inorm = nn.InstanceNorm2d(16, affine=True)
        self.up = nn.ConvTranspose2d(16, 8, 4, stride=2, padding=1)
        self.ln = nn.LayerNorm(8)
        self.c3 = nn.Conv2d(8, 32, 3, padding=1, padding_mode="reflect")
        self.ps = nn.PixelShuffle(2)
        self.head = nn.Linear(8 * 3 * 5 + 8 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.g1(self.c1(x)))
        h = F.leaky_relu(self.inorm(self.c2(h)), 0.1)
        h = self.up(h)
        h = self.ln(h.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        h = F.interpolate(h, scale_factor=0.5, mode="bilinear", align_corners=False)
        h = F.interpolate(h, scale_factor=2, mode="nearest")
        h = self.ps(self.c3(h))  # 32 channels -> 8 at twice the size
        h = F.pixel_unshuffle(h, 2)[:, :8]
        a = F.adaptive_avg_pool2d(h, (3, 5)).flatten(1)
        m = F.adaptive_max_pool2d(h, 2).flatten(1)
        return self.head(torch.cat([a, m], dim=1))


def _image32(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    return {"x": torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(3))}


class PaddedAttention(nn.Module):
    """nn.MultiheadAttention with a key padding mask, nn.TransformerEncoderLayer with a
    causal mask, masked mean pooling over the valid positions."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)
        self.layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        self.out = nn.Linear(32, 6)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids)
        pad = attention_mask == 0
        a, _ = self.mha(x, x, x, key_padding_mask=pad, need_weights=False)
        causal = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        h = self.layer(x + a, src_mask=causal, is_causal=True)
        keep = attention_mask.unsqueeze(-1).to(h.dtype)
        return self.out((h * keep).sum(1) / keep.sum(1).clamp(min=1))


def _masked_ids(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    return {"input_ids": _ids(batch, seq, 1), "attention_mask": _mask(batch, seq)}


class SequenceOps(nn.Module):
    """cumsum/cumprod, top-k, sort, argsort, gather, scatter and scatter_add, where,
    masked_fill, einsum, strided and negative slicing, index_select, integer-tensor indexing,
    an in-place update of a slice, clamp, flip, roll."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 16)
        self.mix = nn.Parameter(torch.randn(4, 16, 16) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)                                          # b, n, 16
        c = torch.cumsum(h, dim=1) / torch.arange(1, h.shape[1] + 1, dtype=h.dtype).view(1, -1, 1)
        vals, idx = torch.topk(h, 4, dim=-1)
        srt, order = torch.sort(h, dim=1, descending=True)
        g = torch.gather(h, 2, idx)                               # == vals
        s = torch.zeros_like(h).scatter(2, idx, vals)
        sa = torch.zeros_like(h).scatter_add(2, idx, g * 2)
        w = torch.where(h > 0, h, 0.1 * h).masked_fill(h.abs() < 0.05, 0.0)
        e = torch.einsum("bnd,kde->bkne", w, self.mix).mean(1)
        sl = h[:, ::2, 1:-1].flip(1).roll(1, dims=2)
        sel = h.index_select(1, torch.tensor([0, 2, 3]))[:, :, order[0, 0, :4]]
        out = c + s + sa + e + srt * 0.5
        out = out.clone()
        out[:, :, :4] += vals.clamp(-1, 1)
        out[:, 1:, :] *= 2
        return torch.cat([out.flatten(1), sl.flatten(1), sel.flatten(1), torch.cumprod(h.tanh(), 1).flatten(1)], 1)


def _seq16(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    return {"x": torch.randn(batch, seq, 16, generator=torch.Generator().manual_seed(6))}


class HalfPrecision(nn.Module):
    """float32 parameters, bf16 and f16 compute inside: casts in and out, a bf16 matmul, an f16
    layer norm, softmax in float32 of bf16 scores (the mixed-precision patterns of LLMs)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 32)
        self.b = nn.Linear(32, 16)
        self.norm = nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.linear(x.bfloat16(), self.a.weight.bfloat16(), self.a.bias.bfloat16())
        scores = torch.softmax((h @ h.transpose(1, 2)).float() / 32 ** 0.5, dim=-1).to(torch.bfloat16)
        h = F.gelu(scores @ h).float()
        y = self.b(h).half()
        y = F.layer_norm(y, (16,), self.norm.weight.half(), self.norm.bias.half())
        return y.float() + x


class IntegerOps(nn.Module):
    """Integer arithmetic on token ids feeding an embedding: floor division, remainder, bitwise
    and/xor/shift, comparisons, argmax, one-hot, integer cumsum, clamp, casts to float."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(64, 16)
        self.out = nn.Linear(16 + 8 + 1, 4)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        a = torch.div(input_ids, 7, rounding_mode="floor") % 64
        b = (input_ids ^ (input_ids >> 2)) & 63
        pos = torch.cumsum(torch.ones_like(input_ids), dim=1) - 1
        h = self.emb(a) + self.emb(b) + self.emb(pos.clamp(max=63))
        hot = F.one_hot(input_ids.argmax(dim=1) % 8, 8).to(h.dtype)
        even = (input_ids % 2 == 0).sum(1, keepdim=True).to(h.dtype)
        return self.out(torch.cat([h.mean(1), hot, even], dim=1))


class Resampling(nn.Module):
    """3-d and 1-d convolutions (transposed too), bicubic and trilinear interpolation,
    grid sampling, average pooling with ceil mode and without padding counts, max pooling with
    indices and unpooling, im2col (`F.unfold`) and its inverse (`F.fold`), channel shuffle."""

    def __init__(self) -> None:
        super().__init__()
        self.c3 = nn.Conv3d(2, 4, 3, padding=1)
        self.t1 = nn.ConvTranspose1d(4, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.c2 = nn.Conv2d(4, 8, 3, padding=1)
        self.head = nn.Linear(361, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.c3(x.view(x.shape[0], 2, 3, 16, 16)).mean(2)          # b, 4, 16, 16
        v = F.interpolate(v, size=(12, 20), mode="bicubic", align_corners=True)
        t = F.interpolate(v.unsqueeze(2), scale_factor=(2, 0.5, 0.5), mode="trilinear").squeeze(2).mean(1)
        line = self.t1(v.mean(3))                                          # b, 4, 24
        theta = torch.tensor([[0.9, 0.1, 0.05], [-0.1, 0.8, 0.0]]).expand(x.shape[0], 2, 3)
        grid = F.affine_grid(theta, [x.shape[0], 4, 10, 10], align_corners=False)
        g = F.grid_sample(v, grid, mode="bilinear", padding_mode="border", align_corners=False)
        h = F.channel_shuffle(self.c2(g), 2)
        p = F.avg_pool2d(h, 3, 2, padding=1, ceil_mode=True, count_include_pad=False)
        m, idx = F.max_pool2d(h, 2, return_indices=True)
        u = F.max_unpool2d(m, idx, 2, output_size=h.shape[-2:])
        cols = F.unfold(u, 3, padding=1, stride=2)
        back = F.fold(cols, (10, 10), 3, padding=1, stride=2)
        feats = torch.cat([p.flatten(1), back.mean(1).flatten(1), line.flatten(1), t.flatten(1)[:, :65]], 1)
        return self.head(feats[:, :361])


def _image6(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    return {"x": torch.randn(batch, 6, 16, 16, generator=torch.Generator().manual_seed(3))}


class Losses(nn.Module):
    """A classifier trained on its own losses: cross entropy with ignored labels and label
    smoothing, NLL with class weights, BCE with logits and pos_weight, KL divergence, smooth L1,
    Huber, cosine embedding, margin ranking, CTC; `F.normalize`, logsumexp, cdist."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 10))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.body(x)                                              # b, n, 10
        flat = logits.flatten(0, 1)
        ce = F.cross_entropy(flat, labels.flatten(), ignore_index=3, label_smoothing=0.1)
        nll = F.nll_loss(F.log_softmax(flat, -1), labels.flatten(), weight=torch.linspace(0.5, 1.5, 10))
        bce = F.binary_cross_entropy_with_logits(flat, (flat.detach() > 0).float(), pos_weight=torch.full((10,), 2.0))
        kl = F.kl_div(F.log_softmax(flat, -1), F.softmax(flat.detach() * 0.5, -1), reduction="batchmean")
        sl1 = F.smooth_l1_loss(flat, flat.detach().round(), beta=0.5) + F.huber_loss(flat, flat.detach() * 0.9)
        a, b = flat[: flat.shape[0] // 2], flat[flat.shape[0] // 2:]
        cos = F.cosine_embedding_loss(a, b, torch.ones(a.shape[0]).sign())
        rank = F.margin_ranking_loss(a[:, 0], b[:, 0], torch.ones(a.shape[0]), margin=0.1)
        logp = F.log_softmax(logits.transpose(0, 1), -1)                   # n, b, 10
        ctc = F.ctc_loss(logp, labels[:, :3].clamp(min=1), torch.full((x.shape[0],), x.shape[1], dtype=torch.long),
                         torch.full((x.shape[0],), 3, dtype=torch.long))
        extra = torch.logsumexp(F.normalize(flat, dim=-1), -1).mean() + torch.cdist(a, b).mean() * 0.01
        return torch.stack([ce, nll, bce, kl, sl1, cos, rank, ctc, extra])


def _loss_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(6)
    return {"x": torch.randn(batch, seq, 16, generator=g), "labels": torch.randint(0, 10, (batch, seq), generator=g)}


class Indexing(nn.Module):
    """Advanced indexing: boolean-mask assignment, index_put with accumulate, index_add,
    index_copy, masked_scatter, take_along_dim, searchsorted, bucketize, tril/triu, diagonal,
    unbind/stack, repeat/expand/tile, narrow, split, chunk, as_strided-free unfold of a dim."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)                                                   # b, n, 8
        h2 = h.clone()
        h2[h2 < -0.5] = -0.5
        acc = torch.zeros(h.shape[0], 4, 8).index_put((torch.arange(h.shape[0]).unsqueeze(1), idx % 4), h,
                                                       accumulate=True)
        ia = torch.zeros(6, 8).index_add(0, idx[0] % 6, h[0])
        ic = torch.zeros(h.shape[1] + 2, 8).index_copy(0, torch.arange(h.shape[1]) + 1, h[1])
        ms = torch.zeros_like(h).masked_scatter(h > 0, h.flatten()[: h.numel()] * 2)
        tal = torch.take_along_dim(h, h.argsort(-1)[..., :3], -1)
        edges = torch.linspace(-1, 1, 5)
        bins = torch.bucketize(h.detach(), edges).to(h.dtype) + torch.searchsorted(edges, h.detach().contiguous()).to(h.dtype)
        sq = h[0, :8, :8]
        tri = sq.tril(-1) + sq.triu(1).t() + torch.diag_embed(sq.diagonal())
        parts = torch.stack(list(h.unbind(1))[::2], 1)
        win = h.transpose(1, 2).unfold(2, 4, 2)                            # b, 8, windows, 4
        a, b = h.split([3, 5], -1)
        c1, c2 = h.chunk(2, 1)
        out = [h2, acc, ia, ic, ms, tal, bins * h, tri, parts, win, a.repeat(1, 1, 2), b.narrow(2, 1, 3),
               (c1 + c2).tile(1, 2, 1), h.expand(2, *h.shape).sum(0)]
        return torch.cat([o.flatten().unsqueeze(0) for o in out], 1)


def _index_inputs(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    g = torch.Generator().manual_seed(8)
    return {"x": torch.randn(batch, seq, 8, generator=g), "idx": torch.randint(0, 16, (batch, seq), generator=g)}


class WeightNormConv(nn.Module):
    """Weight-normalized convolutions (the old `nn.utils.weight_norm` and the parametrization),
    spectral norm of a linear layer, PReLU, GLU, ELU/SELU/CELU/softplus/mish activations."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.utils.weight_norm(nn.Conv1d(4, 16, 5, padding=2))
        self.c2 = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 3, padding=1), dim=2)
        self.prelu = nn.PReLU(8)
        self.lin = nn.Linear(8, 8)
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.glu(self.c1(x), dim=1)                                       # b, 8, t
        h = self.prelu(self.c2(h))
        h = F.elu(h) + F.selu(h) * 0.5 + F.celu(h, 0.7) + F.softplus(h, beta=2) + F.mish(h)
        h = self.lin(h.transpose(1, 2))
        return self.out(F.hardtanh(h, -2, 2) + F.softsign(h) + F.logsigmoid(h))


def _wave4(model: nn.Module, batch: int, seq: int, mask: bool) -> dict[str, Any]:
    return {"x": torch.randn(batch, 4, seq, generator=torch.Generator().manual_seed(9))}


LOCAL: dict[str, ModelCase] = {
    "recurrent": ModelCase("recurrent", Recurrent, lambda m, b, s, k: {"input_ids": _ids(b, s, 1)}, _same),
    "embedding_bag": ModelCase("embedding_bag", Bags, _bag_inputs, _same, sequence=False, shape=(3, 6)),
    "convmix": ModelCase("convmix", ConvMix, _image32, _same, sequence=False, shape=(2, 0)),
    "padded_attention": ModelCase("padded_attention", PaddedAttention, _masked_ids, _same, shape=(3, 12)),
    "sequence_ops": ModelCase("sequence_ops", SequenceOps, _seq16, _same, shape=(2, 8)),
    "half_precision": ModelCase("half_precision", HalfPrecision, _seq16, _same, shape=(2, 8)),
    "integer_ops": ModelCase("integer_ops", IntegerOps, lambda m, b, s, k: {"input_ids": _ids(b, s, 1)}, _same),
    "resampling": ModelCase("resampling", Resampling, _image6, _same, sequence=False, shape=(2, 0)),
    "losses": ModelCase("losses", Losses, _loss_inputs, _same, shape=(2, 8)),
    "indexing": ModelCase("indexing", Indexing, _index_inputs, _same, shape=(2, 10)),
    "weight_norm": ModelCase("weight_norm", WeightNormConv, _wave4, _same, shape=(2, 24)),
}

CASES: dict[str, ModelCase] = {
    **{k: ModelCase(k, _causal_lm(k), _lm_inputs, _logits) for k in DECODERS},
    **{k: ModelCase(k, _encoder(k), _encoder_inputs, _hidden) for k in ENCODERS},
    "bart": ModelCase("bart", _bart, _bart_inputs, _logits),
    "whisper": ModelCase("whisper", _whisper, _whisper_inputs, _logits, sequence=False),
    **{k: ModelCase(k, _vision(k), _pixels, _hidden, sequence=False, shape=(2, 0)) for k in VISION},
    **{k: ModelCase(k, _audio(k), _wave, _hidden, sequence=False, shape=(2, 800)) for k in AUDIO},
    **LOCAL,
}

#: Models whose outputs are computed in bf16/f16 somewhere: tolerances of those formats.
HALF = frozenset({"half_precision"})


def build(name: str, seed: int = 0) -> nn.Module:
    """The model `name` with weights from `seed`, in eval mode."""
    torch.manual_seed(seed)
    return CASES[name].build().eval()
