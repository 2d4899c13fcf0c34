"""`LLM`: load a model, then generate, stream or chat.

Generation runs the `Decoder` one step at a time over a static KV cache: a prefill step per
prompt chunk (padded up to one of `PREFILL_BUCKETS` tokens, so a handful of graphs serve every
prompt length) and one decode step per token, whose inputs (ids, positions, slots) are
tensors, so the compiled decode graph is the same for every position.

One `LLM` serves many callers: each request (a `generate_ids` run) owns a KV cache from the
`KVPool` while it runs, and the steps of all requests are serialized by one lock held only
for the step itself (never across a ``yield``), so threads calling `generate`/`stream` at once
and stream generators interleaved on one thread each get the text they would get alone.
"""
from __future__ import annotations

import os
import random
import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Generator, Iterator, Optional, Sequence, Union

import torch

from ...runtime.omp_team import release as release_omp_team
from ..model.chat_template import DEFAULT_LIMITS, Message, TemplateLimits, render_chat
from ..model.decoder import Decoder
from ..model.kv_cache import KVCache
from ..model.progress import Step
from ..model.tokenizer import Tokenizer
from .kv_pool import KVPool
from .sampling import SamplingParams, first_argmax_in_chunks, greedy_tokens, next_tokens
from .step_runner import StepCache, _LazyCompile, compiling, step_cache_enabled
from .text_stream import TextStream, cut_at_stop
from .thread_governor import ThreadGovernor

#: Prefill chunk lengths (prompts are padded up to the next one; longer ones are chunked).
PREFILL_BUCKETS = (16, 64, 256)
#: ``max_context`` default: the model's context length, capped here (the KV cache is
#: ``2 * layers * kv_heads * head_dim * 4`` bytes per slot and row).
DEFAULT_CONTEXT_CAP = 4096
DEFAULT_MAX_NEW_TOKENS = 256

Prompt = Union[str, Sequence[Message]]


#: What a prefill chunk costs beyond its (padded) tokens, in tokens: `prefill_plan` pads a
#: 31-token prompt to two chunks of 16 rather than one of 64.
CHUNK_COST = 4


def prefill_plan(n: int, first: int, max_context: int,
                 buckets: Sequence[int] = PREFILL_BUCKETS, tails: bool = True) -> list[tuple[int, int]]:
    """(padded size, real tokens) of each prefill chunk for slots ``first .. n``: the cheapest
    cover by bucket-sized chunks (every chunk full but the last, which is padded), costed as
    its padded tokens plus `CHUNK_COST` per chunk; a tail of a few tokens may instead run
    through the decode step, one token a step (``(1, 1)`` chunks, each costed as a chunk of
    one; ``tails=False``: only a last single token, for engines where a step's rows cost
    next to nothing beside the step itself, as on a GPU). Where no bucket fits before
    ``max_context``, the rest is one exact chunk.

    Padding is work (every padded row runs through every layer): a 31-token chat prompt cost
    about 2 s of CPU as one 64-token chunk here and half that as two of 16. A 19-token prompt
    of an 8B model (2 threads) took 1.16 s for its second 16-token chunk of 3 real tokens;
    three decode steps take 0.73 s."""
    best: dict[int, tuple[int, list[tuple[int, int]]]] = {n: (0, [])}
    for slot in range(n - 1, first - 1, -1):
        remaining = n - slot
        tail = (remaining * (1 + CHUNK_COST), [(1, 1)] * remaining)  # token by token
        options: list[tuple[int, list[tuple[int, int]]]] = []
        for b in buckets:
            if slot + b > max_context:
                continue
            if b >= remaining:
                options.append((b + CHUNK_COST, [(b, remaining)]))
            else:
                cost, rest = best[slot + b]
                options.append((b + CHUNK_COST + cost, [(b, b)] + rest))
        if not options:
            options.append((remaining + CHUNK_COST, [(remaining, remaining)]))
        if tails or remaining == 1:
            options.append(tail)  # on a tie, the fewest chunks wins
        best[slot] = min(options, key=lambda o: (o[0], len(o[1])))
    return best[first][1]


def aligned_plan(n: int, first: int, max_context: int, aligned: int) -> list[tuple[int, int]]:
    """(padded size, real tokens) of each chunk of an aligned prefill (`LLM.prefill_chunks`'s
    ``aligned``) of slots ``first .. n``: chunks of exactly ``aligned`` tokens at multiples of
    it (the last padded), whatever ``n``; where a chunk would overrun ``max_context``, its
    tokens one at a time through the decode step (``(1, 1)`` each). A token's chunk then
    depends only on its slot, never on the longest row of a batch: an exact last chunk of
    ``n - at`` tokens would change with ``n`` (another step shape, another attention form, its
    past segment ending elsewhere), so a row's keys beside a longer prompt would differ from
    its keys alone, and the step shape would be one the warm-up never compiled.

        aligned_plan(35, 0, 40, 16) == [(16, 16), (16, 16), (1, 1), (1, 1), (1, 1)]
        aligned_plan(35, 16, 64, 16) == [(16, 16), (16, 3)]"""
    plan: list[tuple[int, int]] = []
    for at in range(first, n, aligned):
        real = min(aligned, n - at)
        plan += [(aligned, real)] if at + aligned <= max_context else [(1, 1)] * real
    return plan


def _thread_governor(device: str) -> Optional[ThreadGovernor]:
    """A `ThreadGovernor` for the CPU engine's steps where more than one thread is configured
    and `TORCHBURN_ADAPTIVE_THREADS` is on."""
    from ...runtime.config import get_config

    config = get_config()
    threads = config.num_threads or torch.get_num_threads()
    if device != "cpu" or not config.adaptive_threads or threads < 2:
        return None
    return ThreadGovernor(threads)


class ContextError(ValueError):
    """A prompt that does not fit in ``max_context``."""


@dataclass(frozen=True)
class GenerationDefaults:
    """Defaults of `LLM.generate`, from the model's ``generation_config.json`` when it has one."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    sampling: SamplingParams = SamplingParams(temperature=0.0)

    @staticmethod
    def from_dict(cfg: dict[str, Any]) -> "GenerationDefaults":
        do_sample = bool(cfg.get("do_sample", False))
        params = SamplingParams(
            temperature=float(cfg.get("temperature", 1.0)) if do_sample else 0.0,
            top_k=int(cfg.get("top_k") or 0) if do_sample else 0,
            top_p=float(cfg.get("top_p") or 1.0) if do_sample else 1.0,
            min_p=float(cfg.get("min_p") or 0.0) if do_sample else 0.0,
            repetition_penalty=float(cfg.get("repetition_penalty") or 1.0),
        )
        return GenerationDefaults(int(cfg.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS), params)


class LLM:
    """A loaded language model with its tokenizer; see `from_pretrained`."""

    def __init__(
        self,
        model: Decoder,
        tokenizer: Tokenizer,
        *,
        max_context: Optional[int] = None,
        defaults: Optional[GenerationDefaults] = None,
        compile: bool = True,
        name: str = "model",
        device: str = "cpu",
        quant: Optional[str] = None,
    ) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        limit = min(self.config.max_position_embeddings, DEFAULT_CONTEXT_CAP)
        if max_context is not None and (not isinstance(max_context, int) or max_context < 1):
            raise ValueError(f"max_context must be a positive integer; got {max_context!r}")
        self.max_context = max_context or limit
        self.defaults = defaults or GenerationDefaults()
        self.name, self.device, self.quant = name, device, quant
        #: Bounds on rendering the chat template (time, output size, ranges; raise them here).
        self.template_limits: TemplateLimits = DEFAULT_LIMITS
        self.eos_ids = frozenset(tokenizer.eos_token_ids) | frozenset(self.config.eos_token_ids)
        self.pad_id = next(iter(x for x in (tokenizer.pad_token_id, self.config.pad_token_id,
                                            *sorted(self.eos_ids), 0) if x is not None))
        #: KV caches of requests: each `generate_ids` run owns one while it runs.
        self.kv = KVPool(self._new_cache)
        #: Held for the duration of one step (the compiled step, its step cache and Dynamo are
        #: not reentrant across threads); never held across a ``yield``.
        self._step_lock = threading.Lock()
        self.compiled = compile
        #: Step shapes run through `torch.compile` so far (without the step cache).
        self._compiled_shapes: set[tuple[Any, ...]] = set()
        self._step: Callable[..., Any] = self._eager_step
        self.steps = StepCache(self) if compile and step_cache_enabled() else None
        if compile:  # Dynamo loads on the first call that needs it (a warm step cache needs none)
            self._step = _LazyCompile(self._eager_step)
        #: On the GPU, the greedy decode step (`_greedy_step`: the token picked on the device
        #: and fed to the next step there), run by `_decode_greedy`.
        self.greedy_steps = (StepCache(self, _LazyCompile(self._greedy_step), "greedy")
                             if self.steps is not None and device == "gpu" else None)
        #: The CPU steps' team size, chosen by their measured time (None: the configured count).
        self.governor = _thread_governor(device)

    # ---------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(
        cls,
        source: Optional[Union[str, os.PathLike[str]]] = None,
        quant: Optional[str] = None,
        device: str = "auto",
        max_context: Optional[int] = None,
        threads: Optional[int] = None,
        *,
        compile: bool = True,
        chat_template: Optional[str] = None,
    ) -> "LLM":
        """Load a folder (``config.json`` + safetensors + ``tokenizer.json``), a ``.gguf``
        file, or a Hugging Face id; ``None`` loads the default SmolLM2-135M-Instruct GGUF.

        ``quant``: None keeps the checkpoint's weights (GGUF block types stay quantized),
        "int8"/"int4" quantize float weights on load (docs/llm.md lists which), "f16" stores
        the float linears and token embedding as float16 for the GPU engine (f32 arithmetic).
        """
        from ...runtime.gc_pause import gc_paused
        from .device import select_device
        from ..model.source import resolve
        from ..model.weight_cache import cached_load
        from ..model.weights import QUANT_CHOICES

        if quant not in QUANT_CHOICES:
            raise ValueError(f"quant must be one of None, 'int8', 'int4', 'f16'; got {quant!r}")
        chosen = select_device(device, threads)
        if quant == "f16" and chosen != "gpu":
            raise ValueError("quant='f16' stores float16 weights for the GPU engine (device='gpu'), which "
                             "converts them as its products load them; on the CPU engine use None, 'int8' or "
                             "'int4'")
        path = resolve(source)
        defaults = None
        # mapping the weight cache makes ~100k small objects: no full collections meanwhile
        with gc_paused():
            if path.is_file():
                from ..model.gguf_loader import GGUFError
                from ..model.tokenizer import tokenizer_from_gguf

                if path.suffix != ".gguf":
                    raise GGUFError(f"{path} is a file but not a .gguf file")
                model, meta = cached_load(path, quant, lambda record: _gguf_for_cache(path, quant, record))
                tokenizer = tokenizer_from_gguf(meta)
                del meta
            else:
                from ..model.safetensors_loader import load_safetensors_model, read_json
                from ..model.tokenizer import tokenizer_from_folder

                def build(record: Callable[[str, Any], None]) -> tuple[Decoder, dict[str, Any]]:
                    with Step(f"loading the weights of {path.name}" + (f" ({quant})" if quant else "")):
                        return load_safetensors_model(path, quant, record), {}

                model, _ = cached_load(path, quant, build)
                tokenizer = tokenizer_from_folder(path)
                gen = path / "generation_config.json"
                if gen.is_file():
                    defaults = GenerationDefaults.from_dict(read_json(gen))
        if chat_template is not None:
            tokenizer.chat_template = chat_template
        if chosen == "gpu":  # the GPU engine reads GGUF Q5_0 / Q6_K linears as int8 codes
            from ..model.gpu_weights import lay_out_for_gpu

            lay_out_for_gpu(model)
        llm = cls(model, tokenizer, max_context=max_context, defaults=defaults,
                  compile=compile, name=_display_name(source, path), device=chosen, quant=quant)
        # the load's torch ops left an OpenMP team in this thread, which may never run a step:
        # a second team would make every team sleep between parallel regions (`omp_team`)
        release_omp_team()
        return llm

    # ---------------------------------------------------------------- steps
    def _eager_step(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                    starts: torch.Tensor, past: torch.Tensor,
                    logit_index: Optional[torch.Tensor]) -> torch.Tensor:
        """The step the engine compiles: the decoder, then its keys and values written into
        their slots of ``past`` (the cache view `KVCache.step` hands it), in the same graph."""
        logits, new = self.model(ids, positions, slots, starts, past, logit_index)
        past.index_copy_(3, slots, new)
        return logits

    def _greedy_step(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                     starts: torch.Tensor, past: torch.Tensor,
                     logit_index: Optional[torch.Tensor]) -> torch.Tensor:
        """`_eager_step`, then the first index of each row's largest last logit, as int32
        ``[B, 1]`` (the next step's ``ids``): on the GPU only this comes back, not the logits.

        Written as maxima, then the least index holding the maximum (`argmax`'s first index),
        row reductions over chunks of the row that the GPU engine spreads over workgroups
        (`first_argmax_in_chunks`): its `argmax` (a reduction of value-index pairs) ran in
        one invocation, 1.2 ms of a 3 ms step over 49,152 logits on the H100."""
        last = self._eager_step(ids, positions, slots, starts, past, logit_index)[:, -1]
        return first_argmax_in_chunks(last)

    def _new_cache(self, batch: int) -> KVCache:
        cache = self.model.new_cache(batch, self.max_context)
        if self.device == "gpu":  # the GPU owns its values: nothing comes down per step
            from ...backend.gpu_resident import keep_on_gpu

            keep_on_gpu(cache.tensor)
        return cache

    def cache_for(self, batch: int) -> KVCache:
        """A static KV cache for ``batch`` rows that no running request holds (an idle one of
        the pool, else a new one); the caller owns it (`release_cache` hands it back)."""
        return self.kv.acquire(batch)

    def release_cache(self, cache: KVCache) -> None:
        """Hand a cache from `cache_for` back to the pool for later requests."""
        self.kv.release(int(cache.tensor.shape[1]), cache)

    def run_step(self, cache: KVCache, ids: torch.Tensor, first_slot: int, starts: torch.Tensor,
                 logit_index: Optional[torch.Tensor] = None) -> torch.Tensor:
        """One step (a prefill chunk or a decode token) of ``ids [B, T]`` at slots
        ``first_slot ..``: logits, and the cache updated."""
        if ids.shape[1] == 1:  # a decode step: two tiny tensors built from lists (tensor
            # arithmetic here cost ~30 us a step, most of a server turn's own work)
            slots = torch.tensor([first_slot])
            positions = torch.tensor([[max(first_slot - s, 0)] for s in starts.tolist()])
        else:
            slots = torch.arange(first_slot, first_slot + ids.shape[1])
            positions = (slots[None, :] - starts[:, None]).clamp(min=0)
        with self._step_lock, torch.no_grad():
            def step() -> torch.Tensor:
                if self.steps is not None:
                    return self.steps.run(cache, ids, positions, slots, starts, logit_index)
                shape = (tuple(ids.shape), logit_index is None, torch.is_grad_enabled())
                if self.compiled and shape not in self._compiled_shapes:
                    self._compiled_shapes.add(shape)
                    with compiling(ids, self.config.num_hidden_layers):
                        return cache.step(self._step, ids, positions, slots, starts, logit_index,
                                          dynamic=self.compiled)
                return cache.step(self._step, ids, positions, slots, starts, logit_index,
                                  dynamic=self.compiled)

            if self.governor is None:
                return step()
            return self.governor.run((tuple(ids.shape), logit_index is None), step)

    def _prefill(self, rows: list[list[int]], cache: KVCache,
                 starts: torch.Tensor, first: int = 0,
                 buckets: Sequence[int] = PREFILL_BUCKETS) -> torch.Tensor:
        """Run the prompts (left-padded to one length) through the model from slot ``first``
        (the slots before it already hold these tokens) in chunks of ``buckets`` tokens; last
        logits [B, V]."""
        steps = self.prefill_chunks(rows, cache, starts, first, buckets)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def prefill_chunks(self, rows: list[list[int]], cache: KVCache,
                       starts: torch.Tensor, first: int = 0,
                       buckets: Sequence[int] = PREFILL_BUCKETS,
                       aligned: int = 0) -> Generator[int, None, torch.Tensor]:
        """`_prefill` one chunk at a time: yields the slots filled so far after each chunk's
        step and returns the last logits [B, V], so that a caller (the server's scheduler) can
        run other steps between the chunks of a long prompt.

        ``aligned`` (a chunk length; ``first`` a multiple of it): every row starts at slot 0
        (right-padded, ``starts`` zeros) and runs in chunks of exactly ``aligned`` tokens
        (the last padded; at the context's end, one token a step: `aligned_plan`), so each of
        a row's tokens is computed in the same chunk, at the same place, whatever the other
        rows and wherever the prefill starts: the batch-invariant prefill of `Scheduler`. The
        logits returned are then those of slot ``n - 1`` for every row, a right-padded row's
        pad there: `Scheduler` runs each prompt's last token through a decode step instead."""
        n = max(len(r) for r in rows)
        tokens = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        for b, r in enumerate(rows):
            at = 0 if aligned else n - len(r)
            tokens[b, at:at + len(r)] = torch.tensor(r, dtype=torch.long)
        if aligned and (first % aligned or bool(starts.any())):
            raise ValueError(f"an aligned prefill starts at a multiple of {aligned} with rows from slot 0; "
                             f"got first={first}, starts={starts.tolist()}")
        slot = first
        logits = None
        tails = self.device != "gpu"  # a GPU step's rows are nearly free beside the step
        plan = (aligned_plan(n, first, self.max_context, aligned) if aligned
                else prefill_plan(n, first, self.max_context, buckets, tails))
        for size, real in plan:
            if size == 1:  # one token (a one-token prompt, a chunked prompt's last): the decode step
                logits = self.run_step(cache, tokens[:, slot:slot + 1].contiguous(), slot, starts)
                slot += 1
            else:
                chunk = torch.full((len(rows), size), self.pad_id, dtype=torch.long)
                chunk[:, :real] = tokens[:, slot:slot + real]
                logits = self.run_step(cache, chunk, slot, starts, torch.tensor([real - 1]))
                slot += real
            yield slot
        assert logits is not None
        return logits[:, -1]

    # ---------------------------------------------------------------- generation core
    def encode_prompt(self, prompt: Prompt, add_generation_prompt: bool = True) -> list[int]:
        """Token ids for a prompt string or a list of chat messages (rendered by the template)."""
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        text = self.render(prompt, add_generation_prompt=add_generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The chat template applied to ``messages``."""
        t = self.tokenizer
        return render_chat(t.chat_template, messages, add_generation_prompt, limits=self.template_limits,
                           bos_token=t.bos_token or "", eos_token=t.eos_token or "")

    def _params(self, temperature: Optional[float], top_k: Optional[int], top_p: Optional[float],
                min_p: Optional[float], repetition_penalty: Optional[float]) -> SamplingParams:
        given = {k: v for k, v in dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                       min_p=min_p, repetition_penalty=repetition_penalty).items()
                 if v is not None}
        return replace(self.defaults.sampling, **given)

    def generate_ids(self, rows: list[list[int]], max_new_tokens: int, params: SamplingParams,
                     seed: Optional[int] = None, *, cached: int = 0,
                     cache: Optional[KVCache] = None) -> Iterator[list[Optional[int]]]:
        """Yield, per step, one new id per row (None for rows that already ended).

        The run owns a KV cache of the pool from its first step to its end (returned when the
        generator finishes or is closed), or uses ``cache``, a caller's own (`ChatSession`).
        ``cached``: for one row, how many of its first tokens ``cache`` already holds at their
        slots (a chat's earlier turns); only the rest is prefilled."""
        if not rows or any(len(r) == 0 for r in rows):
            raise ValueError("every prompt must have at least one token")
        if cached and (len(rows) != 1 or not 0 <= cached < len(rows[0])):
            raise ValueError(f"cached={cached} needs one row longer than it")
        if cached and cache is None:
            raise ValueError("cached= needs the cache that holds those tokens (cache=)")
        if cache is not None and int(cache.tensor.shape[1]) != len(rows):
            raise ValueError(f"cache= has {int(cache.tensor.shape[1])} rows; the batch has {len(rows)}")
        n = max(len(r) for r in rows)
        if n > self.max_context:
            raise ContextError(f"the prompt has {n} tokens; max_context is {self.max_context}")
        budget = min(max_new_tokens, self.max_context - n)
        generator = torch.Generator().manual_seed(seed if seed is not None
                                                  else random.getrandbits(63))
        batch = len(rows)
        starts = torch.tensor([n - len(r) for r in rows], dtype=torch.long)
        seen = torch.tensor([[r[0]] * (n - len(r)) + r for r in rows], dtype=torch.long)
        done = [False] * batch
        own = cache is None
        mine = self.cache_for(batch) if cache is None else cache
        try:
            yield from self._decode(rows, mine, starts, cached, seen, budget, params, generator, done, n)
        finally:
            if own:
                self.release_cache(mine)
            # the steps' OpenMP team goes with the generation: a thread pool's threads that
            # ran generations would otherwise each keep one, and more than one team makes every
            # team sleep between parallel regions (`omp_team`: 3x slower decoding)
            release_omp_team()
        if budget < max_new_tokens and not all(done):
            warnings.warn(f"generation stopped at max_context={self.max_context} tokens",
                          stacklevel=3)

    def _decode(self, rows: list[list[int]], cache: KVCache, starts: torch.Tensor, cached: int,
                seen: torch.Tensor, budget: int, params: SamplingParams,
                generator: torch.Generator, done: list[bool],
                n: int) -> Iterator[list[Optional[int]]]:
        """The prefill, then up to ``budget`` sampled steps of `generate_ids` in ``cache``."""
        if self.greedy_steps is not None and params.greedy and params.repetition_penalty == 1.0:
            yield from self._decode_greedy(rows, cache, starts, cached, budget, done, n)
            return
        logits = self._prefill(rows, cache, starts, cached)
        for step in range(budget):
            use_seen = seen if params.repetition_penalty != 1.0 else None
            with torch.no_grad():
                chosen = next_tokens(logits, params, generator, use_seen)
            yield self._emit(chosen, done)
            if all(done) or step == budget - 1:
                break
            if use_seen is not None:
                seen = torch.cat([seen, chosen[:, None]], dim=1)
            logits = self.run_step(cache, chosen[:, None], n + step, starts)[:, -1]

    def _emit(self, chosen: torch.Tensor, done: list[bool]) -> list[Optional[int]]:
        """Each row's token, or None for a row that is done (it reached an end of sequence,
        now or before: ``done`` is updated)."""
        out: list[Optional[int]] = []
        for b, t in enumerate(chosen.tolist()):
            if done[b] or t in self.eos_ids:
                done[b] = True
                out.append(None)
            else:
                out.append(int(t))
        return out

    def _decode_greedy(self, rows: list[list[int]], cache: KVCache, starts: torch.Tensor, cached: int,
                       budget: int, done: list[bool], n: int) -> Iterator[list[Optional[int]]]:
        """`_decode` for greedy decoding on the GPU, pipelined: each step picks its token on
        the device and writes it into the next step's ``ids`` there (`_greedy_step`,
        `StepCache.submit`), so step t+1 is submitted before step t's token is read (a few
        bytes, not the logits): the host encodes and submits while the GPU works. A step
        past an end of sequence may have run meanwhile: its result is dropped (its cache
        slot is after every token kept)."""
        from ...backend.gpu_resident import discard_device_values, keep_on_gpu

        steps = self.greedy_steps
        assert steps is not None
        batch = len(rows)
        logits = self._prefill(rows, cache, starts, cached)
        chosen = greedy_tokens(logits.float())
        # the same tensors every step and every request of this cache, written in place: their
        # device buffers and the step's bind groups stay the same (new tensors per step would
        # alternate between two buffers while a step is in flight)
        io = cache.step_inputs
        if "greedy_ids" not in io:
            io.update(greedy_ids=keep_on_gpu(torch.zeros(batch, 1, dtype=torch.int32)),
                      greedy_slots=torch.zeros(1, dtype=torch.long),
                      greedy_positions=torch.zeros(batch, 1, dtype=torch.long))
        ids, slots, positions = io["greedy_ids"], io["greedy_slots"], io["greedy_positions"]
        discard_device_values(ids).copy_(chosen[:, None])  # the last request's fed token is not wanted

        def submit(slot: int) -> Callable[[], Any]:
            with self._step_lock, torch.no_grad():
                slots.fill_(slot)
                torch.sub(slots[None, :], starts[:, None], out=positions).clamp_(min=0)
                return steps.submit(cache, ids, positions, slots, starts, feed=0)

        def wait(result: Callable[[], Any]) -> torch.Tensor:
            with self._step_lock, torch.no_grad():
                return result()[:, 0].long()

        pending: Optional[Callable[[], Any]] = None
        try:
            for step in range(budget):
                if step:
                    if pending is None:  # the first decode step: after the first token is out (TTFT)
                        pending = submit(n)
                    ahead = submit(n + step) if step + 1 < budget else None
                    chosen, pending = wait(pending), ahead
                yield self._emit(chosen, done)
                if all(done) or step == budget - 1:
                    break
        finally:
            if pending is not None:  # a step submitted ahead: wait for it, drop its token
                wait(pending)

    # ---------------------------------------------------------------- public API
    def generate(
        self,
        prompt: Union[Prompt, Sequence[Prompt]],
        max_new_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        seed: Optional[int] = None,
        stop: Optional[Sequence[str]] = None,
    ) -> Union[str, list[str]]:
        """The generated text for a prompt (a string or a list of chat messages), or a list of
        texts for a list of prompts (run as one left-padded batch)."""
        prompts, single = _as_batch(prompt)
        rows = [self.encode_prompt(p) for p in prompts]
        params = self._params(temperature, top_k, top_p, min_p, repetition_penalty)
        ids: list[list[int]] = [[] for _ in rows]
        stops = list(stop or [])
        limit = self.defaults.max_new_tokens if max_new_tokens is None else max_new_tokens
        for step in self.generate_ids(rows, limit, params, seed):
            for b, t in enumerate(step):
                if t is not None:
                    ids[b].append(t)
            if stops and all(cut_at_stop(self.tokenizer.decode(i, True), stops)[1] for i in ids):
                break
        texts = [cut_at_stop(self.tokenizer.decode(i, skip_special_tokens=True), stops)[0] for i in ids]
        return texts[0] if single else texts

    def stream(
        self,
        prompt: Prompt,
        max_new_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repetition_penalty: Optional[float] = None,
        seed: Optional[int] = None,
        stop: Optional[Sequence[str]] = None,
    ) -> Iterator[str]:
        """Yield the generated text piece by piece (never splitting a UTF-8 character)."""
        if not isinstance(prompt, str) and prompt and not isinstance(prompt[0], dict):
            raise ValueError("stream() takes one prompt; use generate() for a batch")
        rows = [self.encode_prompt(prompt)]
        params = self._params(temperature, top_k, top_p, min_p, repetition_penalty)
        limit = self.defaults.max_new_tokens if max_new_tokens is None else max_new_tokens
        yield from self.stream_ids(rows[0], limit, params, seed, stop)

    def stream_ids(self, prompt_ids: list[int], max_new_tokens: int, params: SamplingParams,
                   seed: Optional[int], stop: Optional[Sequence[str]]) -> Iterator[str]:
        steps = (s[0] for s in self.generate_ids([prompt_ids], max_new_tokens, params, seed))
        yield from self.stream_tokens(steps, stop)

    def stream_tokens(self, tokens: Iterator[Optional[int]],
                      stop: Optional[Sequence[str]]) -> Iterator[str]:
        """Text pieces of a stream of token ids (None ends it), held back at stop strings and
        incomplete UTF-8."""
        text = TextStream(self.tokenizer, stop or ())
        for t in tokens:
            if t is None:
                break
            piece = text.push(t)
            if piece:
                yield piece
            if text.stopped:
                return
        rest = text.finish()
        if rest:
            yield rest

    def chat(self, system_prompt: Optional[str] = None, **kwargs: Any) -> None:
        """An interactive multi-turn chat on the terminal (``/reset``, ``/exit``, Ctrl-C stops
        the current answer)."""
        from .chat import run_chat

        run_chat(self, system_prompt=system_prompt, **kwargs)

    def __repr__(self) -> str:
        return (f"LLM({self.name!r}, architecture={self.config.architecture}, "
                f"layers={self.config.num_hidden_layers}, quant={self.quant}, "
                f"device={self.device}, max_context={self.max_context})")


def _gguf_for_cache(path: Path, quant: Optional[str],
                    record: Callable[[str, Any], None]) -> tuple[Decoder, dict[str, Any]]:
    """A GGUF load for `weight_cache.cached_load`: the model, and of its metadata what the
    tokenizer and chat template read (``tokenizer.*``, kept in the cache entry)."""
    from ..model.gguf_loader import load_gguf_model

    with Step(f"loading the weights of {path.name}"):
        model, meta = load_gguf_model(path, quant, record)
    return model, {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


def _as_batch(prompt: Union[Prompt, Sequence[Prompt]]) -> tuple[list[Prompt], bool]:
    """(prompts, whether a single prompt was given)."""
    if isinstance(prompt, str):
        return [prompt], True
    items = list(prompt)
    if not items:
        raise ValueError("empty prompt list")
    if isinstance(items[0], dict):  # one conversation
        return [items], True
    return items, False


def model_size_bytes(model: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _display_name(source: Any, path: Path) -> str:
    """What a model is called in reports: its Hub id when loaded by one (the snapshot folder's
    name is a commit hash), else the file or folder name."""
    text = str(source) if source is not None else ""
    if text and not Path(text).expanduser().exists() and text.count("/") == 1:
        return text
    return path.name
