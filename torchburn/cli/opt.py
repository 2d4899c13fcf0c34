"""`torchburn-opt`: run passes on IR text from the command line, as `mlir-opt` does for MLIR.

    torchburn-opt model.tbir --passes "canonicalize,fuse,lower-to-loops,vectorize"
    torchburn-opt model.tbir --passes "fuse,lower-to-loops" --emit llvm -o model.ll
    torchburn-opt - --passes fuse < model.tbir                 # read standard input
    torchburn-opt --list-passes
    torchburn-opt --load-pass-plugin my_passes.py model.tbir --passes my-pass

The input holds tensor graphs, loop programs or stand-alone kernels (the text the printer
writes and `TORCHBURN_DUMP` leaves in its folders). Each item is parsed, verified, run through
the pipeline and printed. A pipeline may cross levels: tensor passes run on a graph,
`lower-to-loops` turns it into a program, loop passes run on the program; a pass given IR of
the wrong level is refused before anything runs. A stand-alone kernel runs as a one-kernel
program whose outputs are the buffers it stores to.

`--run` executes what the pipeline leaves with the reference engine (a tensor graph is lowered
with the reference engine's pipeline first) on inputs given as `--input name=file.npy` (the
rest random, `--seed`; symbolic sizes with `--sym s0=4`) and prints its outputs instead of the
IR (`--save-outputs DIR` writes them as .npy; `-o` still receives the IR). `--run-after-each`
runs the input, then the IR after every pass, and reports the first pass after which the
results change (exit status 1 then): bisecting a miscompile pass by pass. See
docs/reference-engine.md.

    torchburn-opt model.tbir --passes "fuse,lower-to-loops,vectorize" --run --input x=x.npy
    torchburn-opt model.tbir --passes "canonicalize,fuse,lower-to-loops,tile,vectorize" --run-after-each

Passes plan for, and `--emit llvm` / `--emit asm` generate code for, the CPU `--target` names
(`host` by default, else `TORCHBURN_TARGET`: `avx2`, `avx512`, `neon`, ... see
`codegen/target.py`). `--emit llvm` / `--emit asm` generate code from a program (`plan-memory` runs
first when the program's temporaries have no workspace offsets yet, as in the compiler);
`--emit wgsl` prints one compute shader per kernel (run `gpu-map` first, as the GPU engine
does, to map loops to invocations); it needs the WGSL code generator (`torchburn.codegen.wgsl`).

Exit status: 0 success; 1 the input is not valid IR or a pass or code generator failed on it
(messages point at FILE:LINE:COL where the text allows); 2 the command line is wrong (unknown
pass or option, a pipeline whose levels do not fit the input, an unreadable file or plugin).
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence, TextIO, Union

from ..ir import loop as lp
from ..ir.parser import IRParseError, parse_all
from ..ir.printer import print_ir
from ..ir.tensor import Graph
from ..ir.verifier import VerificationError, verify
from .opt_run import kernel_program

IR = Union[Graph, lp.Program, lp.Kernel]


class UsageError(Exception):
    """The command line is wrong (exit status 2)."""


class InputError(Exception):
    """The input, or what a pass made of it, is wrong (exit status 1)."""


# ---- passes -----------------------------------------------------------------------------------

def load_builtin_passes() -> dict[str, str]:
    """Register every built-in pass; returns the pass modules that failed to import."""
    import torchburn.passes  # noqa: F401
    from ..passes.base import discover_passes

    return discover_passes()


def load_plugin(path: str) -> None:
    """Execute a Python file as a module so that its `@register_pass` classes register."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"--load-pass-plugin: no such file: {path}")
    module_name = "torchburn_plugin_" + re.sub(r"\W", "_", file.stem)
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UsageError(f"--load-pass-plugin: cannot load {path} as Python")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # so inspect.getsource (and Pass.uuid) find the source
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        sys.modules.pop(module_name, None)
        raise UsageError(f"--load-pass-plugin {path}: {type(err).__name__}: {err}") from err


def _type_name(f: dataclasses.Field) -> str:  # type: ignore[type-arg]
    t = f.type
    if isinstance(t, str):
        return t
    return getattr(t, "__name__", str(t))


def list_passes() -> str:
    """Every registered pass: name, level, options (type and default) and its summary."""
    from ..passes.base import PASSES, _field_default, _format_option

    lines = []
    for name in sorted(PASSES):
        cls = PASSES[name]
        summary = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        lines.append(f"{name:<18} [{cls.level}] {summary}")
        for f in dataclasses.fields(cls):
            default = _field_default(cls, f.name)
            shown = "(required)" if default is dataclasses.MISSING else _format_option(default)
            lines.append(f"{'':<20}{f.name}: {_type_name(f)} = {shown}")
    from ..passes.base import DISCOVERY_FAILURES

    if DISCOVERY_FAILURES:
        lines.append("")
        for module, err in sorted(DISCOVERY_FAILURES.items()):
            lines.append(f"(not loaded: {module}: {err})")
    return "\n".join(lines) + "\n"


def parse_passes(text: str) -> list[Any]:
    from ..passes.base import PassError, parse_pipeline

    try:
        return parse_pipeline(text)
    except PassError as err:
        raise UsageError(f"--passes: {err}") from err


LEVEL_NAMES = {"tensor": "a tensor graph", "loop": "loop IR (a program)"}


def check_levels(passes: Sequence[Any], start: str, what: str) -> None:
    """Refuse a pipeline whose passes do not fit the IR level they would receive."""
    level = start
    for i, p in enumerate(passes, 1):
        need = "tensor" if p.level in ("tensor", "lowering") else "loop"
        if need != level:
            where = f"{what}" if i == 1 else f"the IR after {passes[i - 2].spelling()}"
            hint = ("; lower it first with lower-to-loops" if need == "loop"
                    else "; tensor passes must come before lower-to-loops")
            raise UsageError(f"--passes: pass {i} ({p.spelling()}) works on {LEVEL_NAMES[need]}, "
                             f"but {where} is {LEVEL_NAMES[level]}{hint}")
        if p.level == "lowering":
            level = "loop"


# ---- IR items ----------------------------------------------------------------------------------

def _locate(source: str, filename: str, message: str) -> str:
    """`FILE:LINE:COL: message` plus the line and a caret when the message quotes IR text
    found in the source; else `FILE: message`."""
    quoted = re.search(r"`([^`]+)`", message)
    if quoted:
        needle = quoted.group(1).strip()
        for n, line in enumerate(source.splitlines(), 1):
            col = line.find(needle)
            if col >= 0:
                return f"{filename}:{n}:{col + 1}: {message}\n  {line}\n  {' ' * col}^"
    return f"{filename}: {message}"


def run_item(item: IR, passes: Sequence[Any], instruments: Sequence[Any], target: Optional[Any] = None) -> IR:
    """Run `passes` on one item, with `target` (default: the generic one) in the pass context."""
    from ..ir.target import GENERIC
    from ..passes.base import PassManager

    manager = PassManager(passes, instruments, target=target or GENERIC)
    if isinstance(item, lp.Kernel):
        out = manager.run(kernel_program(item))
        assert isinstance(out, lp.Program)
        return out.kernels[0] if len(out.kernels) == 1 else out
    return manager.run(item)


def resolve_target(name: Optional[str]) -> Any:
    """The target `--target` names (else `TORCHBURN_TARGET`, else the host)."""
    from ..codegen.target import TargetError, named_target
    from ..runtime.config import get_config

    try:
        return named_target(name if name is not None else get_config().target)
    except TargetError as err:
        raise UsageError(str(err)) from None
    except ImportError:  # no llvmlite to describe the host: passes plan for the generic target
        from ..ir.target import GENERIC

        return GENERIC


def emit(items: Sequence[IR], kind: str, target: Optional[Any] = None) -> str:
    if kind == "ir":
        return "\n".join(print_ir(i) for i in items)
    programs = []
    for item in items:
        if isinstance(item, Graph):
            raise UsageError(f"--emit {kind} needs loop IR but @{item.name} is still a tensor graph; "
                             "add lower-to-loops to --passes")
        programs.append(_planned(kernel_program(item) if isinstance(item, lp.Kernel) else item))
    if kind == "wgsl":
        return "\n".join(_wgsl(p) for p in programs)
    from ..codegen.llvm.module import emit_program
    from ..codegen.target import host_target
    from ..runtime import jit

    target = target or host_target()
    out = []
    for p in programs:
        llvm_ir = emit_program(p, target)
        out.append(llvm_ir if kind == "llvm" else jit.assembly(llvm_ir, target))
    return "\n".join(out)


def _planned(p: lp.Program) -> lp.Program:
    if p.temps and not p.temp_offsets:
        from ..passes.base import get_pass

        p = get_pass("plan-memory")().run(p)
    verify(p, planned=True)
    return p


def _wgsl(p: lp.Program) -> str:
    if importlib.util.find_spec("torchburn.codegen.wgsl") is None:
        raise UsageError("--emit wgsl: this build has no WGSL code generator (torchburn.codegen.wgsl)")
    from ..codegen.wgsl import Caps, WgslUnsupported, emit_program

    try:
        shaders = emit_program(p, Caps())
    except WgslUnsupported as err:
        raise InputError(f"error: --emit wgsl: @{p.name} cannot run on WebGPU: {err}") from err
    return "\n".join(f"// kernel @{s.name}: {s.summary}, grid {s.grid}\n{s.source}" for s in shaders)


class _CurrentPass:
    """Instrument remembering which pass is running, to name it when one crashes."""

    name = "?"

    def before_pass(self, p: Any, ir: Any) -> None:
        self.name = p.spelling()

    def after_pass(self, p: Any, ir: Any, seconds: float) -> None:
        pass


# ---- command line ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="torchburn-opt", description="Parse TorchBurn IR, run passes on it, print the result.",
        epilog="exit status: 0 ok, 1 invalid input or a failing pass, 2 bad command line")
    ap.add_argument("file", nargs="?", default="-", help="IR text file (.tbir); '-' or nothing reads standard input")
    ap.add_argument("--passes", default="", metavar="PIPELINE",
                    help='passes to run, e.g. "canonicalize,fuse,lower-to-loops,vectorize{width=8}"')
    ap.add_argument("--print-after-all", action="store_true", help="print the IR after every pass (to stderr)")
    ap.add_argument("--time-passes", action="store_true", help="report the time of each pass (to stderr)")
    ap.add_argument("--verify-each", action=argparse.BooleanOptionalAction, default=True,
                    help="verify the IR after every pass (default: on)")
    ap.add_argument("--emit", choices=("ir", "llvm", "asm", "wgsl"), default="ir", help="what to print (default: ir)")
    ap.add_argument("--target", default=None, metavar="NAME",
                    help="the CPU passes plan for and code is emitted for: host, avx2, avx512, znver4, neon, "
                         "or triple:cpu:features (default: TORCHBURN_TARGET, else host)")
    ap.add_argument("-o", dest="output", metavar="FILE", help="write the result to FILE instead of stdout")
    ap.add_argument("--list-passes", action="store_true", help="list the registered passes and their options")
    ap.add_argument("--load-pass-plugin", action="append", default=[], metavar="FILE.py",
                    help="execute a Python file that registers passes (@register_pass); repeatable")
    run = ap.add_argument_group("running IR with the reference engine")
    run.add_argument("--run", action="store_true", help="run the result on inputs and print its outputs")
    run.add_argument("--run-after-each", action="store_true",
                     help="run the input and the IR after every pass; report the first pass that changes the results")
    run.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input's value (NumPy .npy); inputs not given are random; repeatable")
    run.add_argument("--sym", action="append", default=[], metavar="NAME=INT",
                     help="a symbolic size's value (for random inputs); repeatable")
    run.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    run.add_argument("--save-outputs", metavar="DIR", help="with --run: write each output to DIR/NAME.npy")
    run.add_argument("--rtol", type=float, default=1e-5, help="--run-after-each: relative tolerance for floats")
    run.add_argument("--atol", type=float, default=1e-6, help="--run-after-each: absolute tolerance for floats")
    return ap


class _ArgumentParserExit(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


def _parse_args(ap: argparse.ArgumentParser, argv: Optional[Sequence[str]], stderr: TextIO) -> argparse.Namespace:
    # argparse prints to sys.stderr and exits; route both through our streams.
    def fail(message: str) -> NoReturn:
        ap.print_usage(stderr)
        stderr.write(f"{ap.prog}: error: {message}\n")
        raise _ArgumentParserExit(2)

    ap.error = fail  # type: ignore[method-assign]
    try:
        return ap.parse_args(argv)
    except SystemExit as e:  # --help
        raise _ArgumentParserExit(int(e.code or 0)) from None


def main(argv: Optional[Sequence[str]] = None, stdin: Optional[TextIO] = None,
         stdout: Optional[TextIO] = None, stderr: Optional[TextIO] = None) -> int:
    """Run the tool; returns the exit status (0, 1 or 2). Streams default to sys's."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    ap = build_parser()
    try:
        args = _parse_args(ap, argv, stderr)
    except _ArgumentParserExit as e:
        return e.status
    try:
        return _run(args, stdin, stdout, stderr)
    except UsageError as err:
        stderr.write(f"torchburn-opt: error: {err}\n")
        return 2
    except InputError as err:
        stderr.write(f"{err}\n")
        return 1


def _run(args: argparse.Namespace, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    from ..passes.base import PassError, PrintAfterAll, TimePasses, VerifyAfterEach

    load_builtin_passes()
    for plugin in args.load_pass_plugin:
        load_plugin(plugin)
    if args.list_passes:
        stdout.write(list_passes())
        return 0

    if args.file == "-":
        filename, source = "<stdin>", stdin.read()
    else:
        filename = args.file
        try:
            source = Path(filename).read_text()
        except OSError as err:
            raise UsageError(f"cannot read {filename}: {err.strerror or err}") from err

    passes = parse_passes(args.passes)
    target = resolve_target(args.target)
    try:
        items = parse_all(source, filename)
    except IRParseError as err:
        raise InputError(f"{err}") from err
    if not items:
        raise InputError(f"{filename}: no graph, program or kernel found")
    for item in items:
        try:
            verify(item)
        except VerificationError as err:
            raise InputError(_locate(source, filename, f"error: invalid IR: {err}")) from err
        start = "tensor" if isinstance(item, Graph) else "loop"
        check_levels(passes, start, f"the input @{item.name}")

    timer = TimePasses()
    current = _CurrentPass()
    instruments: list[Any] = [current]
    if args.verify_each:
        instruments.append(VerifyAfterEach())
    if args.print_after_all:
        instruments.append(PrintAfterAll(stderr))
    if args.time_passes:
        instruments.append(timer)

    inputs = _run_inputs(args) if (args.run or args.run_after_each) else None
    changed: list[str] = []
    results: list[IR] = []
    for item in items:
        watch = None
        if args.run_after_each:
            from .opt_run import RunAfterEach, RunError

            try:
                watch = RunAfterEach(item, inputs, stdout, args.rtol, args.atol)
            except (RunError, ArithmeticError) as err:
                raise InputError(f"{filename}: error: --run-after-each: {err}") from err
        try:
            results.append(run_item(item, passes, [*instruments, *([watch] if watch else [])], target))
        except PassError as err:
            raise InputError(f"{filename}: error: {err}") from err
        except (ValueError, TypeError, KeyError, NotImplementedError, AssertionError) as err:
            raise InputError(f"{filename}: error: pass {current.name} failed on @{item.name}: "
                             f"{type(err).__name__}: {err}") from err
        if watch is not None:
            verdict = watch.first_change or "none"
            stdout.write(f"// @{item.name}: first pass after which the results change: {verdict}\n")
            if watch.first_change:
                changed.append(f"@{item.name}: {watch.first_change}")

    if args.run or args.run_after_each:
        if args.output:
            Path(args.output).write_text(emit(results, args.emit, target))
        if args.run:
            _run_results(results, inputs, args, filename, stdout)
        if args.time_passes:
            stderr.write(timer.report() + "\n")
        return 1 if changed else 0

    try:
        text = emit(results, args.emit, target)
    except (UsageError, InputError):
        raise
    except Exception as err:
        raise InputError(f"{filename}: error: --emit {args.emit} failed: {type(err).__name__}: {err}") from err

    if args.time_passes:
        stderr.write(timer.report() + "\n")
    if args.output:
        Path(args.output).write_text(text)
    else:
        stdout.write(text)
    return 0


def _run_inputs(args: argparse.Namespace) -> Any:
    from .opt_run import Inputs, load_inputs, parse_assignments

    try:
        files = parse_assignments(args.input, "--input")
        syms = parse_assignments(args.sym, "--sym")
        symbols = {k: int(v) for k, v in syms.items()}
        arrays = load_inputs(files)
    except ValueError as err:
        raise UsageError(str(err)) from err
    return Inputs(arrays, symbols, args.seed)


def _run_results(results: Sequence[IR], inputs: Any, args: argparse.Namespace, filename: str, stdout: TextIO) -> None:
    from .opt_run import RunError, format_outputs, run_program, save_outputs

    for item in results:
        try:
            outputs = run_program(item, inputs)
        except (RunError, ArithmeticError) as err:
            raise InputError(f"{filename}: error: --run: {err}") from err
        stdout.write(format_outputs(item.name, outputs))
        if args.save_outputs:
            save_outputs(args.save_outputs, outputs)


if __name__ == "__main__":
    sys.exit(main())
