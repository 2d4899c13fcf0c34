"""How the engine runs a compiled step: through the step cache when it knows the step, through
`torch.compile` otherwise (see `step_cache.py` for what is cached and how it is keyed).

Per argument signature (batch, tokens, logit index or not) the first call looks for a stored
step; a miss goes through Dynamo while `backend.entry.observing` watches the compilation, and
the step it learns is checked against Dynamo's result before it is used or stored.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import torch

from . import step_cache as sc
from ..model.kv_cache import MIN_VIEW, KVCache
from ..model.progress import Step

if TYPE_CHECKING:
    from .engine import LLM

log = logging.getLogger("torchburn")

#: Set to 0/off to run every step through `torch.compile` (Dynamo's guards each call).
ENV = "TORCHBURN_LLM_STEP_CACHE"


def step_cache_enabled(env: Optional[dict[str, str]] = None) -> bool:
    value = (os.environ if env is None else env).get(ENV, "").strip().lower()
    return value not in ("0", "off", "no", "false")


def step_label(ids: torch.Tensor, layers: int) -> str:
    """What a step is called in progress messages: the decode step or a prefill chunk."""
    batch, tokens = int(ids.shape[0]), int(ids.shape[1])
    parts = ([] if tokens == 1 else [f"{tokens} tokens"]) + ([f"batch {batch}"] if batch > 1 else [])
    what = "decode step" if tokens == 1 else "prefill step"
    return f"{what} ({'; '.join(parts + [f'{layers} layers'])})"


@contextmanager
def compiling(ids: torch.Tensor, layers: int) -> Iterator[Step]:
    """A `progress.Step` around a step's compilation, its note the graphs and kernels made."""
    from ...backend import report as rep

    point = rep.mark()
    with Step(f"compiling the {step_label(ids, layers)}") as step:
        yield step
        reports = rep.since(point)
        kernels = sum(len(s.kernels) for r in reports for s in r.subgraphs if s.compiled)
        eager = sum(len(r.fallback_ops) for r in reports)
        step.note = (f"{len(reports)} graph{'s' * (len(reports) != 1)}, {kernels} distinct kernels"
                     + (f", {eager} ops left to PyTorch" if eager else ""))


#: Compiled graphs of the step function Dynamo may make (one per argument shape).
STEP_GRAPH_LIMIT = 64


class _LazyCompile:
    """`torch.compile` of the step, made on its first call (importing Dynamo costs a warm
    process time it need not spend when every step comes from the step cache)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.compiled: Optional[Callable[..., Any]] = None

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            # the backend itself, not its registered name: a checkout run from its source tree
            # (PYTHONPATH, no installed entry point) has no "torchburn" backend name
            from ...backend import torchburn_backend

            self.compiled = torch.compile(self.fn, backend=torchburn_backend, dynamic=False)
        # every step shape is a graph of its own (decode buckets, prefill chunks, a server's
        # batched prefills: 13 for `torchburn serve --parallel 16`); past Dynamo's default
        # limit of 8 a shape would run eagerly for good
        with torch._dynamo.config.patch(recompile_limit=STEP_GRAPH_LIMIT):
            return self.compiled(*args)


class StepCache:
    """The compiled steps of one `LLM`, by argument signature."""

    def __init__(self, llm: "LLM", step: Optional[Callable[..., Any]] = None, kind: str = "") -> None:
        self.llm = llm
        #: The compiled step Dynamo runs on a miss (the LLM's own by default), and what it
        #: computes when not the logits (its entries and disk keys are its own).
        self._step = step
        self.kind = kind
        #: signature -> bound step; None: known not to be cacheable (use Dynamo).
        self.entries: dict[str, Optional[Callable[..., tuple[Any, ...]]]] = {}
        self.stats = sc.StepCacheStats()
        self._model_part: Optional[str] = None

    def model_part(self) -> str:
        if self._model_part is None:
            self._model_part = sc.model_fingerprint(self.llm.model)
        return self._model_part

    def run(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            starts: torch.Tensor, logit_index: Optional[torch.Tensor]) -> torch.Tensor:
        """One step, as `KVCache.step` runs it (the past's length marked dynamic only when
        Dynamo runs it)."""
        def dispatch(*args: Any) -> Any:
            return self._dispatch(cache, args)

        return cache.step(dispatch, ids, positions, slots, starts, logit_index, dynamic=False)

    def _key(self, cache: KVCache, sig: str) -> Optional[str]:
        return sc.step_key(self.model_part(), cache.context, sig + (f"|{self.kind}" if self.kind else ""))

    def step_fn(self) -> Callable[..., Any]:
        return self._step if self._step is not None else self.llm._step

    def submit(self, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
               starts: torch.Tensor, feed: int = 0) -> Callable[[], Any]:
        """A step whose one result is also written into step argument `feed` (the greedy
        step's token into ``ids``), submitted without waiting where the step is a bound GPU
        step (`step_cache.bind_gpu`: the result is copied into the argument on the device, and
        the host may submit the next step before it reads this one's); otherwise run now
        (through Dynamo the first time) and written into the argument on the host. Returns the
        function that gives the result."""
        from ...backend import gpu_resident

        first = int(slots[0])
        if first + slots.shape[0] > cache.context:
            raise ValueError(f"slots up to {first + slots.shape[0]} do not fit {cache.context} slots")
        args = (ids, positions, slots, starts, cache.past(first, int(slots.shape[0])), None)
        if not torch.is_grad_enabled():
            fed = getattr(self.entries.get(sc.signature(args)), "submit", None)
            if fed is not None:
                return fed(*args, feed=feed)
        out = self._dispatch(cache, args)
        target = args[feed]
        gpu_resident.to_host(target)  # the device's values, if a fed step left it newer
        target.copy_(out)
        return lambda: out

    def _dispatch(self, cache: KVCache, args: Sequence[Any]) -> Any:
        sig = sc.signature(args)
        grad = torch.is_grad_enabled()
        if not grad:
            if sig not in self.entries:
                key = self._key(cache, sig)
                loaded = None
                if key is not None:
                    label = step_label(args[0], self.llm.config.num_hidden_layers)
                    with Step(f"reading the {label} from the disk cache"):
                        loaded = sc.load(key, self.llm.model)
                if loaded is not None:
                    self.stats.disk_hits += 1
                    self.entries[sig] = loaded
            step = self.entries.get(sig)
            if step is not None:
                try:
                    return step(*args)
                except sc.StaleStep:
                    log.info("torchburn: a cached LLM step refused its arguments; compiling it")
                    self.stats.stale += 1
                    self.entries[sig] = None
        past = args[4]
        torch._dynamo.mark_dynamic(past, 3, min=MIN_VIEW, max=max(cache.context, MIN_VIEW + 1))
        if grad or sig in self.entries:
            return self.step_fn()(*args)
        with compiling(args[0], self.llm.config.num_hidden_layers):
            return self._record(cache, sig, args)

    def _record(self, cache: KVCache, sig: str, args: Sequence[Any]) -> Any:
        """Run the step through Dynamo, learning it when Dynamo compiles it into one native
        call; the learned step must give the same result before it is kept."""
        from ...backend.entry import observing

        seen: list[tuple[Any, ...]] = []
        with observing(lambda *graph: seen.append(graph)):
            out = self.step_fn()(*args)
        self.entries[sig] = None
        if len(seen) != 1:  # no compilation (Dynamo had it already) or graph breaks
            return out
        found = sc.plan_from(*seen[0], self.llm.model, args)
        if found is None:
            self.stats.unplannable += 1
            return out
        plan, launcher = found
        if not isinstance(out, (tuple, list)):
            if len(plan.outputs) != 1:
                self.stats.unplannable += 1
                return out
            plan = dataclasses.replace(plan, single=True)
        step = sc.bind(plan, launcher.launch, self.llm.model)
        try:
            again = step(*args)
        except Exception as err:  # noqa: BLE001 - a plan that does not run is not kept
            log.info("torchburn: the learned LLM step does not run (%s); Dynamo keeps it", err)
            self.stats.unplannable += 1
            return out
        if not sc.same_results(again if isinstance(again, (tuple, list)) else (again,),
                               out if isinstance(out, (tuple, list)) else (out,)):
            log.info("torchburn: the learned LLM step differs from Dynamo's result; not kept")
            self.stats.unplannable += 1
            return out
        self.entries[sig] = step
        self.stats.recorded += 1
        key = self._key(cache, sig)
        if key is not None and sc.store(key, plan, launcher):
            self.stats.stored += 1
        return out
