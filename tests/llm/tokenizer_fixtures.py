"""Small tokenizers trained here (no network), as transformers loads them and as llama.cpp's
converter writes them into GGUF metadata: SentencePiece BPE with byte fallback (Llama 2 /
Mistral style, with a dummy prefix; Gemma style, without) and byte-level BPE with Llama 3's
and Qwen2's pre-tokenizers."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = [
    "the quick brown fox jumps over the lazy dog", "hello world, hello there  my friends",
    "def add(a, b):\n    return a + b\n\tif x != y: pass", "Grüße aus Köln, naïve café",
    "日本語のテキストと中文，한국어", "Привет, мир! مرحبا بالعالم", "numbers 12345 and 3.14159",
    "emoji 🎉🔥 and more text", "   indented\n\n\nlines  ",
] * 20
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}"
                 "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")

# llama.cpp's token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def sentencepiece_folder(folder: Path, gemma: bool) -> Path:
    """A SentencePiece BPE model (byte fallback) with a transformers tokenizer config:
    Llama-style (``<unk> <s> </s>``, a dummy prefix) or Gemma-style (``<pad> <eos> <bos>
    <unk>``, no dummy prefix), user-defined turn markers."""
    import sentencepiece as spm

    folder.mkdir(parents=True, exist_ok=True)
    names = (dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
                  bos_piece="<bos>", unk_piece="<unk>") if gemma else
             dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1))
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_prefix=str(folder / "tokenizer"), vocab_size=420,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
        add_dummy_prefix=not gemma, remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        normalization_rule_name="identity", user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
        control_symbols=["<mask>"] if gemma else [], minloglevel=2, **names)
    config: dict[str, Any] = {"tokenizer_class": "GemmaTokenizer" if gemma else "LlamaTokenizer",
                              "add_bos_token": True, "add_eos_token": False,
                              "chat_template": CHAT_TEMPLATE}
    if gemma:
        config.update(bos_token="<bos>", eos_token="<eos>", unk_token="<unk>", pad_token="<pad>",
                      mask_token="<mask>")
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def sentencepiece_gguf_metadata(folder: Path, reference: Any, gemma: bool) -> dict[str, Any]:
    """``tokenizer.*`` metadata as llama.cpp's converter writes it for a SentencePiece model:
    every piece with its score and type; transformers' added tokens as user-defined (control
    when special); BOS/EOS/UNK/PAD ids; Gemma's ``add_space_prefix = false``."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(folder / "tokenizer.model"))
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        kind = NORMAL
        if sp.IsUnknown(i):
            kind = UNKNOWN
        elif sp.IsControl(i):
            kind = CONTROL
        elif sp.IsUnused(i):
            kind = UNUSED
        elif sp.IsByte(i):
            kind = BYTE
        tokens.append(sp.IdToPiece(i))
        scores.append(sp.GetScore(i))
        types.append(kind)
    for i, added in reference.added_tokens_decoder.items():
        if i < len(tokens) and types[i] == NORMAL:
            types[i] = CONTROL if added.special else USER_DEFINED
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": sp.bos_id(), "tokenizer.ggml.eos_token_id": sp.eos_id(),
        "tokenizer.ggml.unknown_token_id": sp.unk_id(),
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    if sp.pad_id() >= 0:
        meta["tokenizer.ggml.padding_token_id"] = sp.pad_id()
    if gemma:
        meta["tokenizer.ggml.add_space_prefix"] = False
    return meta


#: Byte-level BPE families: (GGUF pre-tokenizer name, splitting regex, special tokens, BOS).
BPE_FAMILIES = {
    "llama-bpe": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                  ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                  "<|begin_of_text|>"),
    "qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
              ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None),
}


def bpe_folder(folder: Path, pre: str) -> Path:
    """A byte-level BPE ``tokenizer.json`` trained here with the family's pre-tokenizer."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    regex, specials, bos = BPE_FAMILIES[pre]
    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens(["<tool>"])  # a user-defined (not special) added token
    if bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
              "eos_token": specials[-1] if bos else "<|im_end|>"}
    if bos:
        config["bos_token"] = bos
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def bpe_gguf_metadata(folder: Path, pre: str) -> dict[str, Any]:
    """``tokenizer.*`` metadata as llama.cpp's converter writes it for a byte-level BPE:
    tokens in id order, special added tokens as control, other added tokens user-defined, the
    merges as ``"a b"`` strings, the pre-tokenizer's name."""
    data = json.loads((folder / "tokenizer.json").read_text())
    vocab = dict(data["model"]["vocab"])
    added = {t["content"]: t for t in data["added_tokens"]}
    for t in added.values():
        vocab[t["content"]] = t["id"]
    tokens = [""] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    types = [(CONTROL if added[t]["special"] else USER_DEFINED) if t in added else NORMAL for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    _, specials, bos = BPE_FAMILIES[pre]
    eos = specials[-1] if bos else "<|im_end|>"
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.eos_token_id": vocab[eos], "tokenizer.ggml.add_bos_token": bos is not None,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    if bos:
        meta["tokenizer.ggml.bos_token_id"] = vocab[bos]
    return meta
