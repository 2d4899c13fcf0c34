"""`Scheduler`: continuous batching of many requests over one `LLM`.

One thread owns the model.  Each turn of its loop (`step`) it
1. admits waiting requests while rows are free: prefills each prompt but its last token (the
   requests that arrived together in one batched prefill; one that a `PrefixCache` entry
   mostly holds from there, alone) and places those keys and values in a row of the shared
   `BatchCache`.  A prefill runs *one chunk per turn* while other requests are decoding
   (a prefill job, `_Job`), so a long prompt arriving delays the running streams by one
   chunk's step per token, not by its whole prefill (chunked prefill, as llama-server and
   vLLM do; here the chunk and the decode rows are two steps of one turn, not one step);
   with no request decoding, a prefill runs all its chunks at once;
2. runs one decode step for every running request at once (one compiled graph per bucket of
   rows; a request that just joined feeds its prompt's last token, whose logits give its
   first token), samples each row's next token with that request's own parameters and
   generator, and hands each request its text;
3. frees the rows of requests that ended: end of sequence, a stop string, their token budget,
   a cancel (a client that went away) or shutdown.

Requests join and leave at token boundaries; nobody waits for a batch to finish.  Every request
ends with exactly one `Finish` event (its reason and token counts), so none is lost silently.
Callers get events through the ``emit`` callback they pass, called on the scheduler's thread.
"""
from __future__ import annotations

import collections
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Generator, Optional, Sequence, Union

import torch

from ...runtime.config import get_config
from ...runtime.omp_team import release as release_omp_team
from .batch_cache import BatchCache
from .prefix_cache import PrefixCache
from .sampling import SamplingParams, greedy_tokens, next_tokens
from .text_stream import TextStream

if TYPE_CHECKING:
    from ..model.kv_cache import KVCache
    from .engine import LLM

log = logging.getLogger("torchburn")

#: Chunk length of a batched prefill (`Scheduler._start_together`): one compiled prefill graph
#: per batch bucket; a chunk of 16 prompts is already 256 rows for the linears.
TOGETHER_CHUNK = 16


class QueueFull(RuntimeError):
    """More requests wait than the scheduler's ``max_queue``."""


class ShuttingDown(RuntimeError):
    """The scheduler is stopping and takes no new requests."""


@dataclass
class Text:
    """A piece of generated text of one request."""

    text: str


@dataclass
class Finish:
    """The end of a request: ``reason`` is "stop" (end of sequence or a stop string), "length"
    (``max_tokens`` or the context), "cancelled" or "error" (``error`` says why)."""

    reason: str
    prompt_tokens: int
    completion_tokens: int
    error: Optional[str] = None


Event = Union[Text, Finish]


@dataclass
class Request:
    """One generation: prompt ids, budget and sampling, and where its events go."""

    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    emit: Callable[[Event], None]
    seed: Optional[int] = None
    stop: Sequence[str] = ()
    cancelled: bool = False                     # set by the caller: freed at the next step
    # set by the scheduler
    row: int = -1
    generated: int = 0
    pending: int = -1                            # the sampled token not yet in the cache
    budget: int = 0
    text: Optional[TextStream] = None
    generator: Optional[torch.Generator] = None
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: Optional[float] = None

    def cancel(self) -> None:
        """Stop generating (the row is freed at the next step; a `Finish` "cancelled" follows)."""
        self.cancelled = True


@dataclass
class Stats:
    """Counters for /metrics (read without a lock: each is one int or float)."""

    requests: collections.Counter = field(default_factory=collections.Counter)  # by finish reason
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefilled_tokens: int = 0
    #: Batched prefills (requests that arrived together) and the prompts they ran.
    batched_prefills: int = 0
    batched_prompts: int = 0
    decode_steps: int = 0
    decode_rows: int = 0
    #: Prefill chunks run, and those run in a turn that also decoded running rows.
    prefill_chunks: int = 0
    interleaved_chunks: int = 0
    #: (time, completion tokens so far) of recent steps, for a tokens/s over a short window.
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=512))

    def tokens_per_second(self, window: float = 10.0) -> float:
        now = time.perf_counter()
        points = [p for p in list(self.recent) if now - p[0] <= window]
        if len(points) < 2 or points[-1][0] <= points[0][0]:
            return 0.0
        return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])


@dataclass
class _Job:
    """A prefill in progress: its requests (rows taken when it ends) and its chunks, a generator
    that runs one chunk's step per ``next`` and joins the requests when it returns."""

    requests: list[Request]
    chunks: Generator[int, None, None]


class Scheduler:
    """Runs requests on ``llm`` in a batch of up to ``parallel`` rows, ``max_queue`` waiting."""

    def __init__(self, llm: "LLM", parallel: int = 4, max_queue: int = 64,
                 prefix_cache: int = 4, invariant: Optional[bool] = None) -> None:
        if parallel < 1:
            raise ValueError(f"parallel must be >= 1; got {parallel}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0; got {max_queue}")
        self.llm = llm
        self.parallel = parallel
        self.max_queue = max_queue
        self.rows = BatchCache(llm._new_cache(parallel))
        self.prefixes = PrefixCache(lambda: llm._new_cache(1), prefix_cache)
        #: Batch-invariant prefills (`_aligned`): by default where the linears are
        #: (TORCHBURN_QLINEAR_INVARIANT, which `torchburn serve` sets).
        self.invariant = get_config().qlinear_invariant if invariant is None else invariant
        self.waiting: collections.deque[Request] = collections.deque()
        self.running: dict[int, Request] = {}
        self.stats = Stats()
        self._wake = threading.Condition()
        self._stopping = False
        self._deadline: Optional[float] = None
        self._thread: Optional[threading.Thread] = None
        #: Rows for batched prefills (`_start_together`), made at the first.
        self._scratch: Optional[BatchCache] = None
        #: Prefills in progress, run in order, one chunk per turn while rows decode.
        self._jobs: collections.deque[_Job] = collections.deque()
        #: Requests of those jobs (rows promised to them): an int that `submit`, on another
        #: thread, reads while the scheduler's thread changes the jobs.
        self._promised = 0

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        """Run the loop in a thread of its own.  The calling thread gives back its OpenMP team
        (a load or a warm-up made one): with two teams alive every team sleeps between
        parallel regions, which made decoding 3x slower (`runtime/omp_team.py`)."""
        release_omp_team()
        self._thread = threading.Thread(target=self._loop, name="torchburn-scheduler", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """Run the loop in the calling thread until `drain`'s requests are done or `stop`
        (the server runs it in the main thread, HTTP in another)."""
        self._loop()

    def submit(self, request: Request) -> None:
        """Queue ``request``; raises `QueueFull` or `ShuttingDown` instead of queueing."""
        if len(request.prompt_ids) == 0:
            raise ValueError("the prompt has no tokens")
        if len(request.prompt_ids) >= self.llm.max_context:
            raise ValueError(f"the prompt has {len(request.prompt_ids)} tokens; the context "
                             f"holds {self.llm.max_context} (at least one for the answer)")
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1; got {request.max_tokens}")
        with self._wake:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if len(self.waiting) >= self.max_queue + self._free_rows():
                raise QueueFull(f"{len(self.waiting)} requests are waiting (--max-queue "
                                f"{self.max_queue}); try again later")
            self.waiting.append(request)
            self._wake.notify()

    def drain(self, timeout: float) -> None:
        """Take no new requests; those running or waiting may finish for ``timeout`` seconds,
        then end with an error event."""
        with self._wake:
            self._stopping = True
            self._deadline = time.perf_counter() + timeout
            self._wake.notify()

    def stop(self, timeout: float = 5.0) -> None:
        """End every request now and the thread with them."""
        self.drain(0.0)
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running and not self._jobs

    def _jobs_changed(self) -> None:
        self._promised = sum(1 for j in self._jobs for r in j.requests if r.row < 0)

    def _free_rows(self) -> int:
        """Rows neither running nor promised to a prefill in progress."""
        return self.rows.free_rows() - self._promised

    def warm_up(self) -> None:
        """Run (and so compile) the decode step of every batch bucket and the prefill chunks
        once, before the first request (each compiled graph is seconds to minutes)."""
        from .batch_cache import bucket_for

        sizes = sorted({bucket_for(n, self.parallel) for n in range(1, self.parallel + 1)})
        for b in sizes:
            view = self.rows.view(b)
            ids = torch.full((b, 1), self.llm.pad_id, dtype=torch.long)
            self.llm.run_step(view, ids, 1, torch.zeros(b, dtype=torch.long))
        from .engine import PREFILL_BUCKETS

        entry, _ = self.prefixes.take([self.llm.pad_id] * 2)
        # a prompt's last chunk of one token (a prefix-cache hit) is a batch-1 decode step on a
        # prefix entry: another graph than the shared rows' (another cache, other strides)
        self.llm.run_step(entry.cache, torch.full((1, 1), self.llm.pad_id, dtype=torch.long), 1,
                          torch.zeros(1, dtype=torch.long))
        for n in ((TOGETHER_CHUNK,) if self.invariant else PREFILL_BUCKETS):
            if n <= self.llm.max_context:
                ids = torch.full((1, n), self.llm.pad_id, dtype=torch.long)
                self.llm.run_step(entry.cache, ids, 0, torch.zeros(1, dtype=torch.long),
                                  torch.tensor([n - 1]))
        self.prefixes.filled(entry, [])
        # batched prefills (`_start_together`): a chunk graph per batch bucket of 2 rows or more
        if TOGETHER_CHUNK <= self.llm.max_context:
            for b in sizes:
                if b >= 2:
                    if self._scratch is None:
                        self._scratch = BatchCache(self.llm._new_cache(self.parallel))
                    ids = torch.full((b, TOGETHER_CHUNK), self.llm.pad_id, dtype=torch.long)
                    self.llm.run_step(self._scratch.view(b), ids, 0, torch.zeros(b, dtype=torch.long),
                                      torch.tensor([TOGETHER_CHUNK - 1]))

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and self.idle:
                    self._wake.wait(0.5)   # a timeout: signal handlers run in between
                past_deadline = self._stopping and time.perf_counter() >= (self._deadline or 0.0)
                if self._stopping and (past_deadline or self.idle):
                    break
            self.step()
        self._fail_all("the server is shutting down")

    def step(self) -> None:
        """One turn of the loop: admit waiting requests (starting their prefills), run a chunk
        of a prefill in progress (all of it when no row decodes), then one decode step of the
        running rows.  The loop's thread calls it; a test may call it instead of `start`."""
        try:
            self._drop_cancelled()
            self._admit()
            self._prefill()
            if self.running:
                self._decode()
        except Exception as err:  # noqa: BLE001 - every request gets an error event, not a hang
            log.exception("torchburn: the scheduler's step failed")
            self._fail_all(f"internal error: {type(err).__name__}: {err}")

    def _drop_cancelled(self) -> None:
        """Waiting requests whose client went away end now (their queue place is free again)."""
        with self._wake:
            if not any(r.cancelled for r in self.waiting):
                return
            gone = [r for r in self.waiting if r.cancelled]
            self.waiting = collections.deque(r for r in self.waiting if not r.cancelled)
        for r in gone:
            self._finish(r, "cancelled")

    def _fail_all(self, message: str) -> None:
        with self._wake:
            waiting = list(self.waiting)
            self.waiting.clear()
        jobs = list(self._jobs)
        self._jobs.clear()
        self._jobs_changed()
        for job in jobs:
            job.chunks.close()
            waiting += [r for r in job.requests if r.row < 0]
        for r in waiting:
            self._finish(r, "error", message)
        for r in list(self.running.values()):
            self._finish(r, "error", message)

    def _admit(self) -> None:
        """Take waiting requests for the free rows (none while a prefill is in progress: its
        requests and the next ones would share the prefix entries and the scratch rows).
        Each row joins holding its prompt but the last token, which the next decode step runs
        beside the other rows' tokens (its logits give the first token).  Requests that arrived
        together prefill in one batched prefill, a prompt that several of them share once
        (`_together`); the others prefill their rests alone, each into its prefix entry.  Each
        prefill is a `_Job` that `_prefill` runs."""
        if self._jobs:
            return
        group: list[Request] = []
        free = self._free_rows()
        while len(group) < free:
            with self._wake:
                if not self.waiting:
                    break
                r = self.waiting.popleft()
            if r.cancelled:
                self._finish(r, "cancelled")
            else:
                group.append(r)
        together = self._together(group)
        batched = {id(r) for r in together}
        for r in group:
            if id(r) not in batched:
                self._jobs.append(_Job([r], self._start_alone(r)))
        if together:
            self._jobs.append(_Job(together, self._start_together(together)))
        self._jobs_changed()

    def _together(self, group: list[Request]) -> list[Request]:
        """The requests of ``group`` that run one batched prefill (none unless two distinct
        prompts do).  Invariant (aligned) prefills continue from the prefix entries at a chunk
        boundary (`_held_together`): the batch takes the prompts with something to prefill
        whose entries hold the same number of whole chunks, the largest such set (so none
        runs again what its entry holds: a long chat continuation beside a new prompt keeps
        its own path); otherwise the prompts that no entry holds half of."""
        sets: dict[int, list[Request]] = {}
        for r in group:
            head = len(r.prompt_ids) - 1
            held = min(self.prefixes.held(r.prompt_ids), head)
            if self._aligned:
                if held < head:                    # a prompt an entry holds whole costs no step
                    sets.setdefault(held - held % self._aligned, []).append(r)
            elif head > 0 and 2 * held < head:
                sets.setdefault(0, []).append(r)

        def distinct(rs: list[Request]) -> int:
            return len({tuple(r.prompt_ids[:-1]) for r in rs})

        best = max(sets.items(), key=lambda kv: (distinct(kv[1]), kv[0]), default=(0, []))[1]
        return best if distinct(best) >= 2 else []   # one prompt: its prefix entry's path

    def _prefill(self) -> None:
        """Run the prefills in progress: one chunk (of the first job that has one left) while
        rows decode, so the running streams get a token per chunk; every chunk when none do.
        A job all of whose requests were cancelled stops; a job that fails ends its requests
        with an error, the others go on."""
        while self._jobs:
            job = self._jobs[0]
            if all(r.cancelled for r in job.requests):
                job.chunks.close()
                self._jobs.popleft()
                self._jobs_changed()
                for r in job.requests:
                    self._finish(r, "cancelled")
                continue
            try:
                next(job.chunks)
            except StopIteration:      # done: its requests joined their rows
                self._jobs.popleft()
                self._jobs_changed()
                continue
            except Exception as err:  # noqa: BLE001 - these requests fail, the others go on
                log.exception("torchburn: a prefill failed")
                self._jobs.popleft()
                self._jobs_changed()
                for r in job.requests:
                    if r.row < 0:
                        self._finish(r, "error", f"internal error: {type(err).__name__}: {err}")
                continue
            self.stats.prefill_chunks += 1
            if self.running:
                self.stats.interleaved_chunks += 1
                return

    @property
    def _aligned(self) -> int:
        """The chunk length of an invariant prefill, 0 for the cheapest chunks.

        Invariant: every prompt, alone or batched, from slot 0 or from a prefix entry, is
        prefilled in chunks of `TOGETHER_CHUNK` tokens starting at multiples of it (padded
        on the right), so each token's keys and values are computed in the same chunk with
        the same attention blocks (`passes/loopgen/attention.py`, `block_origin`) and the
        same linears (rows form) whatever the company: a request's greedy text does not
        depend on the other requests. Otherwise a prompt alone takes `prefill_plan`'s
        cheapest chunks (16/64/256, a tail through decode steps) and a batch is left-padded."""
        return TOGETHER_CHUNK if self.invariant else 0

    def _begin(self, r: Request) -> None:
        r.text = TextStream(self.llm.tokenizer, r.stop)
        r.generator = torch.Generator().manual_seed(r.seed if r.seed is not None
                                                    else random.getrandbits(63))
        r.budget = min(r.max_tokens, self.llm.max_context - len(r.prompt_ids))
        self.stats.prompt_tokens += len(r.prompt_ids)

    def _join(self, r: Request, cache: KVCache, length: int, source_row: int = 0, first: int = 0) -> None:
        """``r`` takes a row holding its first ``length`` prompt tokens (from ``cache``); its
        last prompt token is fed by the next decode step."""
        self._promised -= 1   # first: for a moment `submit` may see one free row too many, never too few
        r.row = self.rows.join(cache, length, source_row, first)
        r.pending = r.prompt_ids[-1]
        self.running[r.row] = r

    def _start_alone(self, r: Request) -> Generator[int, None, None]:
        """The prefill of one prompt into a prefix entry (from the first token the entry does
        not hold), then its row; a step per chunk (`_Job`)."""
        ids = r.prompt_ids
        head = ids[:-1]
        self._begin(r)
        entry, cached = self.prefixes.take(ids, self._aligned or 1)
        if cached < len(head):
            yield from self.llm.prefill_chunks([head], entry.cache, torch.zeros(1, dtype=torch.long),
                                               cached, aligned=self._aligned)
        self.prefixes.filled(entry, head)
        self.stats.prefilled_tokens += len(ids) - cached
        self._join(r, entry.cache, len(head))

    def _start_together(self, rs: list[Request]) -> Generator[int, None, None]:
        """One batched prefill (in chunks of `TOGETHER_CHUNK` tokens) of the distinct prompts
        of ``rs``, left-padded to one length, in the rows of a scratch cache shaped like the
        shared one (so its one-token steps are the decode graphs); then each request's row is
        copied from it, and each prompt kept in the prefix cache.  A step per chunk (`_Job`).

        Invariant (aligned) prefills start at the last chunk boundary that a prefix entry
        holds for every prompt of the group (`_held_together`: the slots before it copied from
        the entries): sixteen clients sharing a system prompt run the rest of their prompts in
        one batched prefill, not each from its entry in turn, a chunk a step."""
        from .batch_cache import bucket_for

        heads: dict[tuple[int, ...], int] = {}
        for r in rs:
            heads.setdefault(tuple(r.prompt_ids[:-1]), len(heads))
        n = max(len(h) for h in heads)
        batch = bucket_for(len(heads), self.parallel)
        rows = [list(h) for h in heads] + [[self.llm.pad_id]] * (batch - len(heads))
        # each row's first slot: left-padded to end together, or (invariant) all from slot 0
        starts = torch.tensor([0 if self.invariant else n - len(r) for r in rows], dtype=torch.long)
        offset = dict(zip(heads, starts.tolist()))
        if self._scratch is None:
            self._scratch = BatchCache(self.llm._new_cache(self.parallel))
        scratch = self._scratch.view(batch)
        for r in rs:
            self._begin(r)
        first = self._held_together(list(heads), scratch) if self._aligned else 0
        yield from self.llm.prefill_chunks(rows, scratch, starts, first, (TOGETHER_CHUNK,), aligned=self._aligned)
        self.stats.batched_prefills += 1
        self.stats.batched_prompts += len(heads)
        for h, k in heads.items():
            self.prefixes.keep(h, scratch, k, offset[h])
        ran: set[tuple[int, ...]] = set()
        for r in rs:
            h = tuple(r.prompt_ids[:-1])
            if h in ran:                  # the same prompt as an earlier one of the group
                self.prefixes.reused_tokens += len(h)
                self.stats.prefilled_tokens += 1
            else:
                ran.add(h)
                self.prefixes.reused_tokens += first
                self.stats.prefilled_tokens += len(r.prompt_ids) - first
            self._join(r, scratch, len(h), heads[h], offset[h])

    def _held_together(self, heads: list[tuple[int, ...]], scratch: KVCache) -> int:
        """The slot an invariant batched prefill of ``heads`` (row ``k`` of ``scratch`` for
        ``heads[k]``) starts at: the last chunk boundary that the prefix entries hold for every
        head, with each row's slots before it copied from its entry (computed in the same
        aligned chunks, so the same values as a prefill from slot 0 gives them)."""
        best = [self.prefixes.best(h) for h in heads]
        # at least one chunk runs (its last slot is the longest head's)
        first = min(min(shared for _, shared in best), max(len(h) for h in heads) - 1)
        first -= first % self._aligned
        if first > 0:
            for k, (entry, _) in enumerate(best):
                assert entry is not None
                scratch.tensor[:, k, :, :first].copy_(entry.cache.tensor[:, 0, :, :first])
        return first

    def _decode(self) -> None:
        for row, r in list(self.running.items()):
            if r.cancelled:
                self._finish(r, "cancelled")
        if not self.running:
            return
        self.rows.make_room()
        batch = self.rows.bucket()
        fed = [[self.llm.pad_id] for _ in range(batch)]
        for row, r in self.running.items():
            fed[row][0] = r.pending
        ids = torch.tensor(fed, dtype=torch.long)   # from a list: a tenth of filling a tensor
        starts = self.rows.row_starts(batch)
        logits = self.llm.run_step(self.rows.view(batch), ids, self.rows.end, starts)[:, -1]
        self.rows.end += 1
        self.stats.decode_steps += 1
        self.stats.decode_rows += len(self.running)
        with torch.no_grad():
            greedy = greedy_tokens(logits.float()).tolist()
            for row, r in list(self.running.items()):
                if r.params.greedy:
                    token = greedy[row]
                else:
                    token = int(next_tokens(logits[row:row + 1], r.params, r.generator)[0])
                self._accept(r, token)
        self.stats.recent.append((time.perf_counter(), self.stats.completion_tokens))

    def _accept(self, r: Request, token: int) -> bool:
        """Take ``token`` as ``r``'s next; False when ``r`` ended with it (finished here)."""
        assert r.text is not None
        if r.first_token_at is None:
            r.first_token_at = time.perf_counter()
        if token in self.llm.eos_ids:
            self._finish(r, "stop")
            return False
        r.generated += 1
        self.stats.completion_tokens += 1
        piece = r.text.push(token)
        if piece:
            r.emit(Text(piece))
        if r.text.stopped:
            self._finish(r, "stop")
            return False
        if r.generated >= r.budget:
            self._finish(r, "length")
            return False
        r.pending = token
        return True

    def _finish(self, r: Request, reason: str, error: Optional[str] = None) -> None:
        if r.row >= 0 and self.running.get(r.row) is r:
            del self.running[r.row]
            self.rows.leave(r.row)
        r.row = -1
        if reason in ("stop", "length") and r.text is not None:
            rest = r.text.finish()
            if rest:
                r.emit(Text(rest))
        self.stats.requests[reason] += 1
        r.emit(Finish(reason, len(r.prompt_ids), r.generated, error))
