"""`torchburn-opt --run` and `--run-after-each`: execute IR with the reference engine.

`--run` runs each item the pipeline leaves (a tensor graph is first lowered with the
reference engine's pipeline, `compiler/reference.py`) on the given inputs (`--input
name=file.npy`, the others random from `--seed`, symbolic sizes from `--sym s0=4`) and prints
or saves (`--save-outputs DIR`) its outputs. `--run-after-each` runs the input first, then the
IR after every pass of `--passes`, and reports the first pass after which the results differ
from the first run (beyond `--rtol`/`--atol` for floats, exactly for integers): the pass to
suspect of a miscompile.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, TextIO, Union

import numpy as np

from ..ir import expr as ex
from ..ir import loop as lp
from ..ir.parser import parse_all
from ..ir.printer import print_ir
from ..ir.tensor import Graph, Value

IR = Union[Graph, lp.Program, lp.Kernel]


class RunError(Exception):
    """The IR cannot be run on these inputs (exit status 1)."""


def parse_assignments(items: Sequence[str], flag: str) -> dict[str, str]:
    """`name=value` pairs (a leading `%` on the name is dropped)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{flag} {item!r}: expected NAME=VALUE")
        out[name.strip().lstrip("%")] = value.strip()
    return out


def load_inputs(files: Mapping[str, str]) -> dict[str, np.ndarray]:
    arrays = {}
    for name, path in files.items():
        try:
            arrays[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise ValueError(f"--input {name}={path}: cannot read it as .npy ({err})") from err
    return arrays


def kernel_program(k: lp.Kernel) -> lp.Program:
    """A program calling `k` once: buffers it stores to are outputs, the others inputs."""
    written = {s.buffer for s in lp.walk_stmts(k.body) if isinstance(s, lp.Store)}
    ins = tuple(b for b in k.params if b.name not in written)
    outs = tuple(b for b in k.params if b.name in written)
    call = lp.KernelCall(k.name, tuple(b.name for b in k.params))
    return lp.Program(k.name, ins, outs, (), k.symbols, (call,), (k,))


def as_program(item: IR) -> lp.Program:
    """Loop IR to run: a kernel as a one-kernel program, a graph lowered with the reference
    pipeline (on a copy: passes may change a graph in place)."""
    if isinstance(item, lp.Program):
        return item
    if isinstance(item, lp.Kernel):
        return kernel_program(item)
    from ..compiler.reference import reference_pipeline
    from ..passes.base import PassManager
    from ..passes.pipeline import Pipeline

    (copy,) = parse_all(print_ir(item), f"<@{item.name}>")
    program = PassManager(reference_pipeline(Pipeline.default()).passes()).run(copy)
    assert isinstance(program, lp.Program)
    return program


def _random(dtype: Any, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    from ..runtime.reference.values import value_dtype

    if dtype.is_bool:
        return rng.random(shape) > 0.5
    if dtype.is_float:
        return rng.standard_normal(shape).astype(value_dtype(dtype))
    lo = 0 if dtype.kind == "u" else -10
    return rng.integers(lo, 10, shape).astype(value_dtype(dtype))


@dataclass
class Inputs:
    """What the user gave: arrays by name, symbol values, the random seed."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    symbols: dict[str, int] = field(default_factory=dict)
    seed: int = 0

    def for_program(self, program: lp.Program, item: IR) -> dict[str, np.ndarray]:
        """An array for every input of `program`: given ones by name (a graph's input names
        map to the program's inputs in order), the rest random (the same for the same seed)."""
        names = [b.name for b in program.inputs]
        if isinstance(item, Graph):  # the user speaks of the graph's names
            names = [v.name for v in item.inputs if isinstance(v, Value)]
        unknown = set(self.arrays) - set(names)
        if unknown:
            raise RunError(f"--input {', '.join(sorted(unknown))}: @{item.name} has no such input "
                           f"(inputs: {', '.join(names) or 'none'})")
        rng = np.random.default_rng(self.seed)
        env = dict(self.symbols)
        out = {}
        for name, b in zip(names, program.inputs):
            if name in self.arrays:
                arr = self.arrays[name]
                for size, n in zip(b.shape, arr.shape):
                    if isinstance(size, ex.Var):
                        env.setdefault(size.name, int(n))
            else:
                try:
                    shape = tuple(ex.evaluate_index(d, env) for d in b.shape)
                except KeyError as err:
                    raise RunError(f"input %{name} has a symbolic size; give it with --sym ({err})") from None
                arr = _random(b.dtype, shape, rng)
            out[b.name] = arr
        return out


def run_program(item: IR, inputs: Inputs) -> dict[str, np.ndarray]:
    """The outputs of `item` run by the reference engine, by name."""
    from ..runtime.reference import ExecutionError, run_arrays

    program = as_program(item)
    try:
        return run_arrays(program, inputs.for_program(program, item), inputs.symbols)
    except ExecutionError as err:
        raise RunError(f"@{item.name}: {err}") from err


def format_outputs(name: str, outputs: Mapping[str, np.ndarray]) -> str:
    lines = [f"// @{name}: {len(outputs)} output(s)"]
    for k, v in outputs.items():
        body = np.array2string(v, threshold=200, precision=6, separator=", ")
        lines.append(f"%{k}: {v.dtype}{list(v.shape)} =\n{body}")
    return "\n".join(lines) + "\n"


def save_outputs(folder: str, outputs: Mapping[str, np.ndarray]) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    for k, v in outputs.items():
        np.save(Path(folder) / f"{k}.npy", v)


def difference(before: Sequence[np.ndarray], after: Sequence[np.ndarray], rtol: float, atol: float) -> Optional[str]:
    """Why two runs' outputs differ (by position), or None when they agree."""
    if len(before) != len(after):
        return f"{len(before)} outputs before, {len(after)} now"
    for k, (a, b) in enumerate(zip(before, after)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {k}: {a.dtype}{list(a.shape)} before, {b.dtype}{list(b.shape)} now"
        if a.dtype.kind == "f":
            close = np.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
        else:
            close = a == b
        if not np.all(close):
            bad = np.argwhere(~close)
            where = tuple(int(i) for i in bad[0])
            return (f"output {k}: {len(bad)} of {a.size} elements differ, first at {list(where)}: "
                    f"{a[where]} before, {b[where]} now")
    return None


class RunAfterEach:
    """Pass-manager instrument: run the IR after every pass and compare with the first run."""

    def __init__(self, item: IR, inputs: Inputs, log: TextIO, rtol: float, atol: float) -> None:
        self.inputs, self.log, self.rtol, self.atol = inputs, log, rtol, atol
        self.name = item.name
        self.reference = list(run_program(item, inputs).values())
        self.index = 0
        self.first_change: Optional[str] = None
        log.write(f"// @{self.name}: ran the input ({len(self.reference)} output(s))\n")

    def before_pass(self, p: Any, ir: Any) -> None:
        pass

    def after_pass(self, p: Any, ir: Any, seconds: float) -> None:
        self.index += 1
        try:
            now: Optional[list[np.ndarray]] = list(run_program(ir, self.inputs).values())
            why = difference(self.reference, now, self.rtol, self.atol)
        except (RunError, ArithmeticError) as err:
            why = f"the IR no longer runs: {err}"
        status = "same results" if why is None else f"results CHANGED: {why}"
        self.log.write(f"// after pass {self.index} ({p.spelling()}): {status}\n")
        if why is not None and self.first_change is None:
            self.first_change = f"pass {self.index} ({p.spelling()})"
