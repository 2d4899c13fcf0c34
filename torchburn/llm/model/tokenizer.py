"""`Tokenizer`: a ``tokenizers`` tokenizer plus what generation needs to know about it (special
tokens, BOS/EOS, the chat template), built from a ``tokenizer.json`` folder or from GGUF
metadata, and `StreamDecoder`, which turns a growing list of ids into text pieces that never
split a UTF-8 character.

From GGUF we rebuild the tokenizer that ``tokenizer.ggml.*`` describes, as a ``tokenizers``
tokenizer built the way transformers builds one from the model's own files:

* ``gpt2`` (byte-level BPE: SmolLM2, Llama 3, Qwen2/3): the vocabulary and merges go into a
  BPE model and ``tokenizer.ggml.pre`` picks the pre-tokenizer (the splitting regex the model
  was trained with);
* ``llama`` (SentencePiece BPE with byte fallback: Llama 2, Mistral, Gemma, Phi-3): the file
  has pieces and scores but no merges; a SentencePiece BPE merges the pair whose result ranks
  first, so every split of a piece into two pieces is a merge, ranked by the piece (its
  position in the vocabulary, then the left part's length). Spaces become ``▁``, with one
  ``▁`` put before the text unless ``tokenizer.ggml.add_space_prefix`` is false (Gemma);
  characters outside the vocabulary become their ``<0xNN>`` byte pieces.

Either way control tokens (type 3) and the unknown token become special tokens, user-defined
ones (type 4) added tokens, and ``add_bos_token``/``add_eos_token`` a post-processor; the
end-of-generation ids are EOS, EOT and the families' end-of-turn tokens (`END_OF_TURN`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from .config import ConfigError

#: llama.cpp's token types.
TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_BYTE = 6
#: SentencePiece's space.
SPACE = "\u2581"
#: Control or user-defined tokens that end a turn in the chat formats of the families we run;
#: like llama.cpp, generation stops at them even where the file names no EOT token (Gemma's
#: files give ``<eos>`` as EOS, its turns end with ``<end_of_turn>``; Phi-3's with ``<|end|>``).
END_OF_TURN = ("<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>",
               "<|endoftext|>", "<|end_of_text|>")

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
#: ``tokenizer.ggml.pre`` -> (split digits one by one first, splitting regex).
PRE_TOKENIZERS: dict[str, tuple[bool, str]] = {
    "default": (False, _GPT2),
    "gpt2": (False, _GPT2),
    "gpt-2": (False, _GPT2),
    "smollm": (True, _GPT2),
    "llama3": (False, _LLAMA3),
    "llama-v3": (False, _LLAMA3),
    "llama-bpe": (False, _LLAMA3),
    "qwen2": (False, _QWEN2),
}


@dataclass
class Tokenizer:
    """Encoding, decoding and the special tokens of one model."""

    backend: Any  # tokenizers.Tokenizer
    bos_token: Optional[str] = None
    eos_token: Optional[str] = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: Optional[int] = None
    add_bos: bool = False
    chat_template: Optional[str] = None
    special_ids: frozenset[int] = field(default_factory=frozenset)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids; ``add_special_tokens`` applies the model's post-processor (e.g. BOS).
        Rendered chat templates already hold their special tokens: encode them without."""
        ids: list[int] = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))


class StreamDecoder:
    """Text pieces for a growing id list.  A piece is released only once it cannot change:
    a trailing U+FFFD means an unfinished multi-byte character (or byte-fallback sequence),
    so it waits for the next token."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.start = 0       # first id of the window still being decoded
        self.emitted = ""    # text of ids[start:] already released

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids[self.start:], skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        piece = text[len(self.emitted):] if text.startswith(self.emitted) else text
        # Restart the window at a clean boundary so decoding stays O(tokens) overall.
        self.start = len(self.ids)
        self.emitted = ""
        return piece

    def flush(self) -> str:
        """What is still held back at the end (invalid bytes come out as U+FFFD)."""
        text = self.tokenizer.decode(self.ids[self.start:], skip_special_tokens=True)
        self.start = len(self.ids)
        return text


def _pre_tokenizer(pre: str) -> Any:
    import warnings

    from tokenizers import Regex, pre_tokenizers

    if pre not in PRE_TOKENIZERS:
        warnings.warn(f"unknown tokenizer.ggml.pre {pre!r}; using GPT-2's splitting "
                      f"(known: {', '.join(sorted(PRE_TOKENIZERS))})", stacklevel=3)
    digits, regex = PRE_TOKENIZERS.get(pre, PRE_TOKENIZERS["default"])
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    return pre_tokenizers.Sequence(steps)


def spm_merges(tokens: Sequence[str]) -> list[tuple[str, str]]:
    """The BPE merges of a SentencePiece BPE vocabulary (pieces in rank order): every split of
    a piece into two pieces of the vocabulary, ranked by the piece, then by the left part's
    length (module docstring); generated in that order, so nothing is sorted."""
    vocab = set(tokens)
    merges = []
    for piece in tokens:
        for cut in range(1, len(piece)):
            left = piece[:cut]
            if left in vocab:
                right = piece[cut:]
                if right in vocab:
                    merges.append((left, right))
    return merges


def _gpt2_backend(reader: Any, tokens: list[str]) -> Any:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models

    from .gguf_loader import GGUFError, field

    merges = []
    for m in field(reader, "tokenizer.ggml.merges") or []:
        a, sep, b = m.partition(" ")
        if not sep:
            raise GGUFError(f"malformed merge {m!r} in tokenizer.ggml.merges")
        merges.append((a, b))
    vocab = {t: i for i, t in enumerate(tokens)}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                     byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(str(field(reader, "tokenizer.ggml.pre", "default")))
    backend.decoder = decoders.ByteLevel()
    return backend


def _spm_backend(reader: Any, tokens: list[str], types: list[int]) -> Any:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers

    from .gguf_loader import field

    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        from .gguf_loader import GGUFError

        raise GGUFError("tokenizer.ggml.tokens lists a piece twice")
    unk = next((tokens[i] for i, t in enumerate(types) if t == TOKEN_UNKNOWN), None)
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=spm_merges(tokens), unk_token=unk,
                                     fuse_unk=True, byte_fallback=True))
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if field(reader, "tokenizer.ggml.add_space_prefix", True):
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first",
                                                         split=False)
        steps.append(decoders.Strip(content=" ", left=1))
    else:
        backend.normalizer = normalizers.Replace(" ", SPACE)
    backend.decoder = decoders.Sequence(steps)
    return backend


def tokenizer_from_gguf(reader: Any) -> Tokenizer:
    """Rebuild the tokenizer described by a GGUF file's ``tokenizer.ggml.*`` metadata."""
    from tokenizers import AddedToken, processors

    from .gguf_loader import GGUFError, field

    kind = field(reader, "tokenizer.ggml.model")
    tokens = field(reader, "tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError("the GGUF file has no tokenizer.ggml.tokens")
    types = list(field(reader, "tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise GGUFError(f"tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens")
    if kind == "gpt2":
        backend = _gpt2_backend(reader, tokens)
        special_types = (TOKEN_CONTROL,)
    elif kind == "llama":
        backend = _spm_backend(reader, tokens, types)
        special_types = (TOKEN_CONTROL, TOKEN_UNKNOWN)
    else:
        raise GGUFError(f"GGUF tokenizer model {kind!r} is not supported (only 'gpt2', the "
                        f"byte-level BPE of SmolLM2, Llama 3 and Qwen, and 'llama', the "
                        f"SentencePiece BPE of Llama 2, Mistral, Gemma and Phi-3); load the "
                        f"model's tokenizer.json folder instead")
    special = [AddedToken(tokens[i], special=True, normalized=False)
               for i, t in enumerate(types) if t in special_types]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types) if t == TOKEN_USER_DEFINED]
    backend.add_special_tokens(special)
    backend.add_tokens(user)

    def token(key: str) -> Optional[str]:
        i = field(reader, key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    # llama.cpp adds BOS by default for SentencePiece vocabularies, not for byte-level BPE ones
    add_bos = bool(field(reader, "tokenizer.ggml.add_bos_token", kind == "llama"))
    add_eos = bool(field(reader, "tokenizer.ggml.add_eos_token", False))
    bos_text, eos_text = token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")
    add_bos = add_bos and bos_text is not None
    add_eos = add_eos and eos_text is not None
    if add_bos or add_eos:
        def segment(seq: str, type_id: int) -> str:
            parts = ([f"{bos_text}:{type_id}"] if add_bos else []) + [f"${seq}:{type_id}"]
            return " ".join(parts + ([f"{eos_text}:{type_id}"] if add_eos else []))

        ids = {t: int(field(reader, f"tokenizer.ggml.{k}_token_id"))
               for t, k, on in ((bos_text, "bos", add_bos), (eos_text, "eos", add_eos)) if on}
        backend.post_processor = processors.TemplateProcessing(
            single=segment("A", 0), pair=f"{segment('A', 0)} {segment('B', 1)}",
            special_tokens=sorted(ids.items()))

    eos_id = field(reader, "tokenizer.ggml.eos_token_id")
    eot_id = field(reader, "tokenizer.ggml.eot_token_id")
    turn_ends = [i for i, t in enumerate(types)
                 if t in (TOKEN_CONTROL, TOKEN_USER_DEFINED) and tokens[i] in END_OF_TURN]
    eos_ids = tuple(dict.fromkeys([int(i) for i in (eos_id, eot_id) if i is not None] + turn_ends))
    return Tokenizer(
        backend=backend,
        bos_token=bos_text,
        eos_token=eos_text,
        eos_token_ids=eos_ids,
        pad_token_id=field(reader, "tokenizer.ggml.padding_token_id"),
        add_bos=add_bos,
        chat_template=field(reader, "tokenizer.chat_template"),
        special_ids=frozenset(i for i, t in enumerate(types) if t in special_types),
    )


def _token_text(value: Any) -> Optional[str]:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def tokenizer_from_folder(folder: Path) -> Tokenizer:
    """``tokenizer.json`` + ``tokenizer_config.json`` (+ ``chat_template.jinja``)."""
    from tokenizers import Tokenizer as HFTokenizer

    from .safetensors_loader import read_json

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"{folder} has no tokenizer.json")
    try:
        backend = HFTokenizer.from_file(str(path))
    except Exception as e:
        raise ConfigError(f"{path} is not a readable tokenizer: {e}") from None
    cfg_path = folder / "tokenizer_config.json"
    cfg = read_json(cfg_path) if cfg_path.is_file() else {}
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    jinja = folder / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
    eos_ids = []
    if eos is not None and backend.token_to_id(eos) is not None:
        eos_ids.append(backend.token_to_id(eos))
    pad = _token_text(cfg.get("pad_token"))
    added = cfg.get("added_tokens_decoder") or {}
    special = frozenset(int(k) for k, v in added.items() if isinstance(v, dict) and v.get("special"))
    return Tokenizer(
        backend=backend,
        bos_token=bos,
        eos_token=eos,
        eos_token_ids=tuple(eos_ids),
        pad_token_id=backend.token_to_id(pad) if pad else None,
        add_bos=bool(cfg.get("add_bos_token", False)),
        chat_template=template if isinstance(template, str) else None,
        special_ids=special,
    )
