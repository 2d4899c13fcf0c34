"""User passes in `torch.compile(..., options={"passes": {...}})`: they run at their insertion
point, and their `uuid()` (a hash of their source) is part of the compile-cache key."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar, Iterator, Sequence

import pytest
import torch

from torchburn.runtime import config
from torchburn.compiler import driver
from torchburn.backend.entry import torchburn_backend
from torchburn.ir.printer import print_ir
from torchburn.ir.tensor import Graph, Op
from torchburn.passes import TensorPass
from torchburn.passes.pattern import DeadOp, Pattern, PatternPass, RewritePattern, Rewriter, is_constant


class FourthPowerToSquares(RewritePattern):
    """pow(x, 4) -> mul(x * x, x * x) (the frontend already turns pow(x, 2) into mul)"""

    op_name = "pow"
    calls: ClassVar[int] = 0

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        x, exponent = op.operands
        if not is_constant(exponent, 4):
            return False
        FourthPowerToSquares.calls += 1
        square = rewriter.insert_op_before(op, "mul", [x, x]).result
        rewriter.replace_op_with(op, "mul", [square, square])  # keeps the op's fusion decision
        return True


@dataclass(frozen=True)
class StrengthReduce(PatternPass):
    """pow(x, 4) -> mul(x * x, x * x); not registered: passed as an object."""

    name: ClassVar[str] = "user-strength-reduce"

    def patterns(self) -> Sequence[Pattern]:
        return [FourthPowerToSquares(), DeadOp()]


@dataclass(frozen=True)
class CountOps(TensorPass):
    """Counts the ops it sees and changes nothing."""

    name: ClassVar[str] = "user-count-ops"
    seen: ClassVar[list[int]] = []

    def run(self, graph: Graph) -> Graph:
        CountOps.seen.append(len(graph.ops))
        return graph


def f(x: torch.Tensor) -> torch.Tensor:
    return x.pow(4) + torch.sigmoid(x) * x


@pytest.fixture()
def fresh_caches(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TORCHBURN_DUMP", raising=False)
    config.reload_config()
    driver.memory_cache().clear()
    yield
    monkeypatch.undo()
    config.reload_config()


def compile_run(passes: dict) -> tuple[torch.Tensor, driver.CompileStats]:  # type: ignore[type-arg]
    torch._dynamo.reset()
    before = driver.CompileStats(**vars(driver.STATS))
    x = torch.randn(16, 64)
    out = torch.compile(f, backend=torchburn_backend, options={"passes": passes})(x)
    torch.testing.assert_close(out, f(x))
    after = driver.STATS
    return out, driver.CompileStats(after.compiled - before.compiled, after.memory_hits - before.memory_hits,
                                    after.disk_hits - before.disk_hits)


def last_program_text() -> str:
    compiled = next(reversed(driver.memory_cache().entries.values()))
    return print_ir(compiled.full_program())


def test_user_passes_run_end_to_end(fresh_caches: None) -> None:
    FourthPowerToSquares.calls = 0
    _, stats = compile_run({"after-fusion": [StrengthReduce()], "loop-start": ["unroll{max_extent=4}"]})
    assert stats.compiled == 1
    assert FourthPowerToSquares.calls == 1
    text = last_program_text()
    assert "pow(" not in text
    assert re.search(r"= (\w+) \* \1\n", text), text  # x * x


def test_user_pass_uuid_is_in_the_cache_key(fresh_caches: None) -> None:
    _, first = compile_run({"after-fusion": [StrengthReduce()]})
    _, other = compile_run({"after-fusion": [CountOps()]})
    assert (first.compiled, other.compiled) == (1, 1)  # two different passes: two compilations
    _, again = compile_run({"after-fusion": [StrengthReduce()]})
    assert again.compiled == 0 and again.memory_hits == 1  # the same pass: a cache hit
    driver.memory_cache().clear()
    _, disk = compile_run({"after-fusion": [StrengthReduce()]})
    assert disk.compiled == 0 and disk.disk_hits == 1  # and on disk, too
    _, none = compile_run({})
    assert none.compiled == 1


def test_uuid_depends_on_the_source() -> None:
    ns: dict[str, object] = {}
    template = '''
import re
from dataclasses import dataclass
from typing import ClassVar
from torchburn.passes import TensorPass

@dataclass(frozen=True)
class P(TensorPass):
    name: ClassVar[str] = "user-p"
    def run(self, graph):
        return {body}
'''
    exec(compile(template.format(body="graph"), "<typed in a REPL>", "exec"), ns)
    a = ns["P"]()
    exec(compile(template.format(body="graph  # changed"), "<typed in a REPL>", "exec"), ns)
    b = ns["P"]()
    exec(compile(template.format(body="(graph)"), "<typed in a REPL>", "exec"), ns)
    c = ns["P"]()
    assert a.uuid() == b.uuid()  # no source to read: the bytecode decides; a comment is no change
    assert a.uuid() != StrengthReduce().uuid()
    assert isinstance(c.uuid(), str)
