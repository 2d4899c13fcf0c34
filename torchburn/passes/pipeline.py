"""The built-in compilation pipeline and the named points where user passes go in.

    tensor-start  -> canonicalize -> form-attention -> fold-batch-norm -> max-pool-grad-to-scatter -> qlinear-to-gemm
                  -> fuse -> after-fusion -> lower-to-loops -> loop-start
                  -> loop passes -> before-codegen -> plan-memory -> codegen

Users add passes at a point from Python (`options={"passes": {"after-fusion": [MyPass()]}}`
in `torch.compile`) or on the command line; each pass's `uuid()` joins the cache key.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence, Union

from .base import Pass, PassError, get_pass, parse_pipeline

INSERTION_POINTS = ("tensor-start", "after-fusion", "loop-start", "before-codegen")

DEFAULT_TENSOR = ("canonicalize", "form-attention", "fold-batch-norm", "max-pool-grad-to-scatter", "qlinear-to-gemm",
                  "fuse")
DEFAULT_LOOP = ("simplify", "fuse-sibling-loops", "tile", "split-reductions", "parallelize", "vectorize", "split-accumulators", "expand-math", "unroll", "simplify")
DEFAULT_FINAL = ("plan-memory",)

PassSpec = Union[Pass, str]


def _instantiate(specs: Sequence[PassSpec]) -> list[Pass]:
    out: list[Pass] = []
    for s in specs:
        if isinstance(s, Pass):
            out.append(s)
        elif isinstance(s, str):
            out.extend(parse_pipeline(s))
        else:
            raise PassError(f"expected a Pass or a pipeline string, got {type(s).__name__}")
    return out


def _available(names: Sequence[str]) -> list[Pass]:
    from .base import DISCOVERED_ONLY, PASSES

    return [get_pass(n)() for n in names if n in PASSES and n not in DISCOVERED_ONLY]


@dataclass
class Pipeline:
    """Passes per phase; `tensor` run on the graph, `loop` and `final` on the program."""

    tensor: list[Pass] = field(default_factory=list)
    lowering: Pass = field(default_factory=lambda: get_pass("lower-to-loops")())
    loop: list[Pass] = field(default_factory=list)
    final: list[Pass] = field(default_factory=list)

    @staticmethod
    def default(user: Mapping[str, Sequence[PassSpec]] | None = None) -> "Pipeline":
        user = dict(user or {})
        unknown = set(user) - set(INSERTION_POINTS)
        if unknown:
            raise PassError(f"unknown pass insertion point(s) {sorted(unknown)}; expected {INSERTION_POINTS}")
        return Pipeline(
            tensor=_instantiate(user.get("tensor-start", ())) + _available(DEFAULT_TENSOR)
            + _instantiate(user.get("after-fusion", ())),
            loop=_instantiate(user.get("loop-start", ())) + _available(DEFAULT_LOOP)
            + _instantiate(user.get("before-codegen", ())),
            final=_available(DEFAULT_FINAL),
        )

    def passes(self) -> list[Pass]:
        return [*self.tensor, self.lowering, *self.loop, *self.final]

    def key(self) -> str:
        """What the pipeline contributes to the cache key (user passes included)."""
        return ";".join(p.uuid() for p in self.passes())


def user_loop_passes(p: "Pipeline") -> list:
    """The loop passes of `p` that the user added: `p.loop` less one occurrence of each built-in
    loop pass of the default pipeline. Engines without the CPU loop passes (GPU, reference) keep
    these."""
    builtin = [x.spelling() for x in Pipeline.default().loop]
    loop = []
    for x in p.loop:
        if x.spelling() in builtin:
            builtin.remove(x.spelling())
        else:
            loop.append(x)
    return loop
