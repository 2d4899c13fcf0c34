"""The public pass API: passes as dataclasses, a registry by name, pipelines parsed from text,
and a pass manager with instrumentation hooks.

A pass is a frozen dataclass whose fields are its options; the same fields are parsed from a
pipeline string, so one definition serves Python and the command line:

    @register_pass
    @dataclass(frozen=True)
    class Tile(LoopPass):
        "Split loops into tiles. (docstring with before/after IR)"
        name = "tile"
        size: int = 32
        def run_program(self, program): ...

    parse_pipeline("fuse,tile{size=64},vectorize")  ->  [Fuse(), Tile(size=64), Vectorize()]

Instrumentation (print after each pass, time passes, dump to a folder) hooks into the pass
manager; passes themselves print nothing.

A pass that depends on the machine (the vector width, the cache sizes, a native dot product)
reads it from the `PassContext` the pass manager hands to `run_in`, never from the host:

    PassManager(passes, target=named_target("avx512")).run(graph)
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import time
import types
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable, Optional, Sequence, TextIO, Union

from ..ir.loop import Program
from ..ir.target import GENERIC, Target
from ..ir.tensor import Graph

IR = Union[Graph, Program]


class PassError(ValueError):
    """A pass or pipeline is misconfigured (unknown pass, bad option, wrong IR level)."""


@dataclass(frozen=True)
class PassContext:
    """What a pass may know besides its IR and its options: the target it compiles for."""

    target: Target = GENERIC


@dataclass(frozen=True)
class Pass:
    """Base of all passes. Subclasses set `name` and implement `run`.

    `run` receives the IR of its level and returns the IR to continue with (tensor passes may
    edit the graph in place and return it).
    """

    name: ClassVar[str] = ""
    #: "tensor" passes take a `Graph`, "loop" passes a `Program`, "lowering" passes turn one
    #: into the other.
    level: ClassVar[str] = "tensor"
    #: Bump when the pass changes behaviour, so cached compilations are not reused.
    version: ClassVar[str] = "1"
    #: A loop pass that maps each kernel on its own (`loop_utils.map_kernels`), its result a
    #: function of the kernel, its options and the target alone: the compile driver then runs
    #: it once per distinct kernel and reuses the result for equal kernels of any graph
    #: (`compiler/kernel_cache.py`). Leave False for a pass that reads the calls or other kernels.
    per_kernel: ClassVar[bool] = False

    def run(self, ir: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError(f"pass {self.name} does not implement run()")

    def run_in(self, ir: Any, ctx: PassContext) -> Any:
        """Run with the pipeline's context; a pass that depends on the target overrides this
        (and its `run` uses `PassContext()`, the generic target)."""
        return self.run(ir)

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def spelling(self) -> str:
        """The pass as written in a pipeline string: `tile{size=64}`."""
        changed = {k: v for k, v in self.options().items()
                   if v != _field_default(type(self), k)}
        if not changed:
            return self.name
        return self.name + "{" + ",".join(f"{k}={_format_option(v)}" for k, v in changed.items()) + "}"

    def uuid(self) -> str:
        """What this pass contributes to the compile-cache key: name, version, options and, for
        passes defined outside torchburn, a hash of the class's source code."""
        parts = [self.name, self.version, repr(sorted(self.options().items()))]
        module = type(self).__module__
        if not module.startswith("torchburn."):
            parts.append(source_digest(type(self)))
        return "|".join(parts)


def source_digest(cls: type) -> str:
    """SHA-256 of a class's source code; where the source cannot be read (a class typed into
    a REPL or built by `exec`), of its methods' bytecode and constants instead, so that a
    changed pass never reuses code compiled for the old one."""
    try:
        return hashlib.sha256(inspect.getsource(cls).encode()).hexdigest()
    except (OSError, TypeError):
        h = hashlib.sha256(f"{cls.__module__}.{cls.__qualname__}".encode())
        for name, value in sorted(vars(cls).items()):
            h.update(name.encode())
            _digest_value(h, getattr(value, "__func__", value))
        return h.hexdigest()


def _digest_value(h: Any, value: Any) -> None:
    code = getattr(value, "__code__", value)
    if isinstance(code, types.CodeType):
        h.update(code.co_code)
        h.update(repr(code.co_names).encode())
        for c in code.co_consts:
            _digest_value(h, c)
    elif isinstance(value, (str, int, float, bool, bytes, tuple, frozenset, type(None))):
        h.update(repr(value).encode())


class TensorPass(Pass):
    """A pass over the tensor-level `Graph`."""

    level: ClassVar[str] = "tensor"


class LoopPass(Pass):
    """A pass over the loop-level `Program`."""

    level: ClassVar[str] = "loop"


def _field_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                return f.default_factory()  # type: ignore[misc]
    return dataclasses.MISSING


def _format_option(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# ---- registry ------------------------------------------------------------------------------------

PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Register a pass class under its `name` so pipelines can name it."""
    if not cls.name:
        raise PassError(f"{cls.__qualname__} has no `name`")
    if not dataclasses.is_dataclass(cls):
        raise PassError(f"pass {cls.name}: decorate the class with @dataclass(frozen=True)")
    PASSES[cls.name] = cls
    if _discovering:
        DISCOVERED_ONLY.add(cls.name)
    return cls


#: Modules of `torchburn.passes` that failed to import during discovery, with the error.
DISCOVERY_FAILURES: dict[str, str] = {}
#: Passes registered only by discovery (their module is not imported by the package): usable
#: by name, but not pulled into the default pipeline, which must not depend on whether some
#: lookup happened to trigger discovery first.
DISCOVERED_ONLY: set[str] = set()
_discovered = False
_discovering = False


def discover_passes() -> dict[str, str]:
    """Import every module of `torchburn.passes` once, so each built-in pass is registered
    even where `passes/__init__.py` does not import its file (a new pass is one new file).
    A module that fails to import is skipped; returns those, with the error."""
    global _discovered, _discovering
    if not _discovered:
        _discovered = _discovering = True
        import importlib
        import pkgutil
        import sys

        package = __name__.rsplit(".", 1)[0]
        for info in pkgutil.walk_packages(sys.modules[package].__path__, prefix=f"{package}."):
            module = info.name
            if module in sys.modules:
                continue
            try:
                importlib.import_module(module)
            except Exception as err:  # a module under construction must not break the others
                DISCOVERY_FAILURES[module] = f"{type(err).__name__}: {err}"
        _discovering = False
    return dict(DISCOVERY_FAILURES)


def get_pass(name: str) -> type[Pass]:
    """The pass class registered as `name` (built-in pass modules are imported on demand)."""
    if name not in PASSES:
        discover_passes()
    try:
        return PASSES[name]
    except KeyError:
        known = ", ".join(sorted(PASSES))
        failed = f"; modules that failed to import: {', '.join(sorted(DISCOVERY_FAILURES))}" \
            if DISCOVERY_FAILURES else ""
        raise PassError(f"unknown pass {name!r}; registered passes: {known}{failed}") from None


def _convert_option(cls: type[Pass], key: str, text: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        raise PassError(f"pass {cls.name} has no option {key!r}; options: {sorted(fields) or 'none'}")
    default = _field_default(cls, key)
    kind = type(default) if default is not dataclasses.MISSING else str
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        return text
    except ValueError:
        raise PassError(f"pass {cls.name}: option {key}={text!r} is not a {kind.__name__}") from None


def parse_pipeline(text: str) -> list[Pass]:
    """Parse `"fuse,tile{size=64,inner=true},vectorize"` into pass instances."""
    passes: list[Pass] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " ,\n\t":
            i += 1
        if i >= n:
            break
        j = i
        while j < n and (text[j].isalnum() or text[j] in "-_."):
            j += 1
        name = text[i:j]
        if not name:
            raise PassError(f"pipeline: expected a pass name at position {i}: {text[i:i + 20]!r}")
        cls = get_pass(name)
        kwargs: dict[str, Any] = {}
        if j < n and text[j] == "{":
            close = text.find("}", j)
            if close < 0:
                raise PassError(f"pipeline: unclosed '{{' after {name!r}")
            body = text[j + 1:close].strip()
            for item in filter(None, (s.strip() for s in body.split(","))):
                if "=" not in item:
                    raise PassError(f"pass {name}: option {item!r} must be key=value")
                k, v = (s.strip() for s in item.split("=", 1))
                kwargs[k] = _convert_option(cls, k, v)
            j = close + 1
        passes.append(cls(**kwargs))
        i = j
    return passes


def pipeline_spelling(passes: Iterable[Pass]) -> str:
    return ",".join(p.spelling() for p in passes)


# ---- instrumentation -------------------------------------------------------------------------------

class Instrument:
    """Hooks the pass manager calls around every pass. Override what you need."""

    def before_pass(self, p: Pass, ir: IR) -> None:
        pass

    def after_pass(self, p: Pass, ir: IR, seconds: float) -> None:
        pass


class PrintAfterAll(Instrument):
    """Print the IR after every pass (`--print-after-all`)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def after_pass(self, p: Pass, ir: IR, seconds: float) -> None:
        from ..ir.printer import print_ir

        self.stream.write(f"// ----- IR after {p.spelling()} -----\n{print_ir(ir)}\n")


class TimePasses(Instrument):
    """Collect the wall time of each pass (`--time-passes`, `explain()`). A pass object run
    several times (the loop passes, run kernel by kernel) is one entry: its runs summed."""

    def __init__(self) -> None:
        self.times: list[tuple[str, float]] = []
        self._entry: dict[int, int] = {}  # id(pass) -> index in `times`
        self._passes: list[Pass] = []  # keeps each pass (and so its id) alive

    def after_pass(self, p: Pass, ir: IR, seconds: float) -> None:
        at = self._entry.get(id(p))
        if at is None:
            self._entry[id(p)] = len(self.times)
            self._passes.append(p)
            self.times.append((p.spelling(), seconds))
        else:
            name, total = self.times[at]
            self.times[at] = (name, total + seconds)

    def report(self) -> str:
        total = sum(t for _, t in self.times) or 1e-12
        lines = [f"{'pass':<40} {'ms':>9} {'%':>6}"]
        for name, t in self.times:
            lines.append(f"{name:<40} {t * 1e3:9.3f} {100 * t / total:6.1f}")
        lines.append(f"{'total':<40} {total * 1e3:9.3f}")
        return "\n".join(lines)


class VerifyAfterEach(Instrument):
    """Run the verifier after each pass so a broken pass is caught where it broke."""

    def after_pass(self, p: Pass, ir: IR, seconds: float) -> None:
        from ..ir.verifier import verify

        try:
            verify(ir)
        except Exception as err:
            raise PassError(f"IR invalid after pass {p.spelling()}: {err}") from err


class PassManager:
    """Runs passes in order, each in one `PassContext` (the target), calling each instrument
    before and after every pass."""

    def __init__(self, passes: Sequence[Pass], instruments: Optional[Sequence[Instrument]] = None,
                 target: Target = GENERIC) -> None:
        self.passes = list(passes)
        self.instruments = list(instruments or [])
        self.context = PassContext(target)

    def run(self, ir: IR) -> IR:
        for p in self.passes:
            expected = Graph if p.level == "tensor" else Program if p.level == "loop" else None
            if expected is not None and not isinstance(ir, expected):
                raise PassError(f"pass {p.name} works on {p.level} IR, got {type(ir).__name__}")
            for inst in self.instruments:
                inst.before_pass(p, ir)
            t0 = time.perf_counter()
            ir = p.run_in(ir, self.context)
            dt = time.perf_counter() - t0
            for inst in self.instruments:
                inst.after_pass(p, ir, dt)
        return ir
