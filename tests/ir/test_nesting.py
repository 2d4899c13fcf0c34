"""Statement nesting has a proven bound (`loop.MAX_NESTING`): every tool handles kernels nested
that deep (loops inside ifs inside loops ...) even when called 600 frames down, inside the
default recursion limit; the parser and the verifier refuse anything deeper with a location.

Statements are walked recursively (a few frames per level) where expressions use explicit
stacks (`test_depth.py`): generated kernels nest a few levels per tensor dimension, so the
bound only ever meets hand-written IR."""
from __future__ import annotations

import sys
from typing import Any, Callable, Iterator

import pytest

from torchburn.codegen import emit_program, host_target
from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.expr import Const, Var
from torchburn.ir.hashing import structural_hash
from torchburn.ir.parser import IRParseError, parse
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import VerificationError, verify
from torchburn.passes.base import PASSES, LoopPass

#: Frames already on the stack when a tool starts (torch.compile's own depth is ~200).
CALLER_FRAMES = 600


def nested(depth: int) -> lp.Program:
    """A program whose kernel nests `depth` statements: for, if, for, if, ... around a store."""
    out = lp.Buffer("out", dt.f32, (Const(4),), (Const(1),), "global")
    body: lp.Stmt = lp.Store("out", (Var("i0", ex.INDEX),), ex.const(1.0, dt.f32))
    level = k = 0
    while level < depth:
        body = lp.For(Var(f"i{k}", ex.INDEX), Const(0), Const(1), "serial", body)
        k += 1
        level += 1
        if level < depth:
            body = lp.If(ex.const(True, dt.bool_), body, None)
            level += 1
    kernel = lp.Kernel("k", (out,), (), body, ())
    return lp.Program("p", (), (out,), (), (), (lp.KernelCall("k", ("out",)),), (kernel,))


def deep_down(frames: int, fn: Callable[[], Any]) -> Any:
    return fn() if frames == 0 else deep_down(frames - 1, fn)


@pytest.fixture
def default_recursion_limit() -> Iterator[None]:
    """Python's default limit for the test: Inductor raises it to 2000 when it compiles (a
    benchmark-comparison test in the same worker did), and our tools must not need that."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def test_every_tool_handles_the_bound_from_deep_in_the_stack(default_recursion_limit: None) -> None:
    assert sys.getrecursionlimit() <= 1000  # nothing raises it during the test
    prog = nested(lp.MAX_NESTING)
    assert lp.nesting_depth(prog.kernels[0].body) == lp.MAX_NESTING
    text = deep_down(CALLER_FRAMES, lambda: print_ir(prog))
    assert deep_down(CALLER_FRAMES, lambda: parse(text)) == prog
    deep_down(CALLER_FRAMES, lambda: verify(prog))
    assert deep_down(CALLER_FRAMES, lambda: structural_hash(prog)) == structural_hash(parse(text))
    assert "define" in deep_down(CALLER_FRAMES, lambda: emit_program(prog, host_target()))
    loop_passes = sorted(n for n, cls in PASSES.items() if issubclass(cls, LoopPass))
    assert {"tile", "vectorize", "unroll", "parallelize", "simplify"} <= set(loop_passes)
    for name in loop_passes:
        deep_down(CALLER_FRAMES, lambda: PASSES[name]().run(prog))


def test_deeper_nesting_is_refused_with_a_location() -> None:
    prog = nested(lp.MAX_NESTING + 1)
    with pytest.raises(VerificationError, match=r"kernel @k: statements nest 101 deep") as err:
        verify(prog)
    assert err.value.where == "kernel @k"
    with pytest.raises(IRParseError, match=r"<string>:\d+:\d+: statements nest more than 100 deep"):
        parse(print_ir(prog))
