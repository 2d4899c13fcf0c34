"""`torchburn-opt`: in process through `main()` and as a subprocess, on the files in tests/data."""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from torchburn.ir.parser import parse_all
from torchburn.ir.verifier import verify
from torchburn.cli.opt import main

DATA = Path(__file__).parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]


def opt(*argv: str, stdin: str = "") -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(list(argv), stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_no_passes_round_trips_the_input() -> None:
    rc, out, err = opt(str(DATA / "pow.tbir"))
    assert rc == 0, err
    assert out.strip() == (DATA / "pow.tbir").read_text().strip()


def test_pipeline_across_levels() -> None:
    rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--passes", "canonicalize,fuse,lower-to-loops,vectorize")
    assert rc == 0, err
    (program,) = parse_all(out)
    verify(program)
    assert out.startswith("program @mlp(")
    assert "ramp(" in out  # vectorized
    assert "full()" not in out and "1.0:f32" not in out  # x * 1 folded away by canonicalize


def test_canonicalize_on_text() -> None:
    rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--passes", "canonicalize")
    assert rc == 0, err
    assert out.splitlines()[-3:] == [
        '  %9 = tanh(%4) : f32[4, 8] loc("aten.tanh.default @ model.py:9")', "  return %9", "}"]


def test_stdin_and_output_file(tmp_path: Path) -> None:
    target = tmp_path / "out.tbir"
    rc, out, err = opt("-", "--passes", "vectorize{width=16}", "-o", str(target), stdin=(DATA / "kernel.tbir").read_text())
    assert rc == 0, err
    assert out == ""
    text = target.read_text()
    assert text.startswith("kernel @scale(") and "ramp(0, 1, 16)" in text


def test_print_after_all_and_time_passes() -> None:
    rc, out, err = opt(str(DATA / "pow.tbir"), "--passes", "canonicalize,fuse", "--print-after-all", "--time-passes")
    assert rc == 0, err
    assert "// ----- IR after canonicalize -----" in err and "// ----- IR after fuse -----" in err
    assert "total" in err and "canonicalize" in err.split("// ----- IR after fuse -----")[-1]


TRANSPOSE_PROGRAM = """\
program @t(%x: f32[64, s0] strides [s0, 1]) -> (%out: f32[s0, 64] strides [64, 1]) symbols(s0) {
  call @k(%x, %out)
}
kernel @k(%x: f32[64, s0] strides [s0, 1], %out: f32[s0, 64] strides [64, 1]) symbols(s0) {
  for i0 in 0..s0 {
    for i1 in 0..64 {
      %out[i0, i1] = %x[i1, i0]
    }
  }
}
"""


def test_tile_pass_on_a_program() -> None:
    rc, out, err = opt("-", "--passes", "tile{size=64}", stdin=TRANSPOSE_PROGRAM)
    assert rc == 0, err
    (program,) = parse_all(out)
    verify(program)
    assert "for i0_o in 0..(s0 + 63) // 64 {" in out and "for i1 in 0..64 {" in out  # one tile wide
    assert "%out[i0_o * 64 + i0_i, i1] = %x[i1, i0_o * 64 + i0_i]" in out


def test_list_passes_shows_options_types_and_defaults() -> None:
    rc, out, err = opt("--list-passes")
    assert rc == 0, err
    lines = out.splitlines()
    canon = next(i for i, ln in enumerate(lines) if ln.startswith("canonicalize "))
    assert "[tensor]" in lines[canon] and "Fold identities" in lines[canon]
    assert lines[canon + 1].split() == ["ignore_signed_zeros:", "bool", "=", "false"]
    assert any(ln.startswith("fuse ") for ln in lines) and any(ln.startswith("lower-to-loops ") for ln in lines)
    assert any("max_recompute_cost: int = 4" in ln for ln in lines)


def test_parse_error_points_at_the_file_position() -> None:
    rc, out, err = opt(str(DATA / "bad_syntax.tbir"))
    assert rc == 1
    assert err.startswith(f"{DATA / 'bad_syntax.tbir'}:3:3: expected ']'")
    assert "^" in err


def test_verifier_error_points_at_the_op() -> None:
    rc, out, err = opt(str(DATA / "bad_type.tbir"))
    assert rc == 1
    first = err.splitlines()[0]
    assert first.startswith(f"{DATA / 'bad_type.tbir'}:3:3: error: invalid IR:"), err
    assert "f32[8]" in first


@pytest.mark.parametrize("passes,message", [
    ("vectorize", "pass 1 (vectorize) works on loop IR (a program), but the input @main is a tensor graph; "
                  "lower it first with lower-to-loops"),
    ("lower-to-loops,fuse", "pass 2 (fuse) works on a tensor graph, but the IR after lower-to-loops is loop IR"),
    ("no-such-pass", "unknown pass 'no-such-pass'"),
    ("fuse{bogus=1}", "pass fuse has no option 'bogus'"),
    ("fuse{max_recompute_cost=many}", "is not a int"),
])
def test_usage_errors_exit_2(passes: str, message: str) -> None:
    rc, out, err = opt(str(DATA / "pow.tbir"), "--passes", passes)
    assert rc == 2
    assert message in err, err


def test_missing_file_and_bad_flag_exit_2() -> None:
    assert opt("no/such/file.tbir")[0] == 2
    rc, _, err = opt("--emit", "pdf", str(DATA / "pow.tbir"))
    assert rc == 2 and "invalid choice" in err


def test_emit_llvm_and_asm() -> None:
    rc, out, err = opt(str(DATA / "pow.tbir"), "--passes", "canonicalize,fuse,lower-to-loops", "--emit", "llvm")
    assert rc == 0, err
    assert "define" in out and "target triple" in out
    rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--passes", "fuse,lower-to-loops", "--emit", "asm")
    assert rc == 0, err  # the temporary is planned before codegen
    assert "torchburn_mlp" in out and ".text" in out or ".section" in out


def test_emit_llvm_needs_loop_ir() -> None:
    rc, out, err = opt(str(DATA / "pow.tbir"), "--emit", "llvm")
    assert rc == 2 and "add lower-to-loops" in err


def test_emit_wgsl() -> None:
    import importlib.util

    rc, out, err = opt(str(DATA / "kernel.tbir"), "--passes", "gpu-map", "--emit", "wgsl")
    if importlib.util.find_spec("torchburn.codegen.wgsl") is None:
        assert rc == 2 and "no WGSL code generator" in err
    else:
        assert rc == 0, err
        assert "@compute" in out


def test_verify_each_catches_a_broken_pass(tmp_path: Path) -> None:
    plugin = tmp_path / "broken.py"
    plugin.write_text('''
from dataclasses import dataclass
from typing import ClassVar
from torchburn.ir.tensor import TensorType
from torchburn.passes import TensorPass, register_pass

@register_pass
@dataclass(frozen=True)
class Broken(TensorPass):
    "Gives the last op a wrong result type."
    name: ClassVar[str] = "test-broken"

    def run(self, graph):
        r = graph.ops[-1].results[0]
        r.type = TensorType(r.type.dtype, r.type.shape + r.type.shape)
        return graph
''')
    rc, out, err = opt("--load-pass-plugin", str(plugin), str(DATA / "pow.tbir"), "--passes", "test-broken")
    assert rc == 1 and "IR invalid after pass test-broken" in err
    rc, out, err = opt("--load-pass-plugin", str(plugin), str(DATA / "pow.tbir"), "--passes", "test-broken",
                       "--no-verify-each")
    assert rc == 0


def test_plugin_errors_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("raise RuntimeError('boom')\n")
    rc, out, err = opt("--load-pass-plugin", str(bad), "--list-passes")
    assert rc == 2 and "RuntimeError: boom" in err
    assert opt("--load-pass-plugin", str(tmp_path / "missing.py"), "--list-passes")[0] == 2


def run_cli(*argv: str, stdin: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "torchburn.cli.opt", *argv], input=stdin, capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)


def test_subprocess_with_plugin() -> None:
    p = run_cli("--load-pass-plugin", str(DATA / "plugin_passes.py"), str(DATA / "pow.tbir"),
                "--passes", "test-square")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "\n".join([
        "graph @main(%x: f32[32, 512]) {",
        '  %4 = mul(%x, %x) : f32[32, 512] loc("aten.pow.Tensor_Scalar @ model.py:6")',
        "  return %4",
        "}"])


def test_subprocess_stdin_and_exit_codes() -> None:
    p = run_cli("--passes", "canonicalize", stdin=(DATA / "pow.tbir").read_text())
    assert p.returncode == 0 and p.stdout.startswith("graph @main")
    assert run_cli(str(DATA / "bad_syntax.tbir")).returncode == 1
    p = run_cli(str(DATA / "pow.tbir"), "--passes", "vectorize")
    assert p.returncode == 2 and "lower-to-loops" in p.stderr


# ---- --run and --run-after-each (the reference engine) ----------------------------------------------

FULL_CPU = "canonicalize,fuse,lower-to-loops,tile,parallelize,vectorize,split-accumulators,expand-math,unroll,simplify"


def test_run_a_tensor_graph_on_given_inputs(tmp_path: Path) -> None:
    import numpy as np

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 16)).astype(np.float32)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    for name, v in (("x", x), ("w", w), ("b", b)):
        np.save(tmp_path / f"{name}.npy", v)
    rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--run", "--input", f"x={tmp_path / 'x.npy'}",
                       "--input", f"%w={tmp_path / 'w.npy'}", "--input", f"b={tmp_path / 'b.npy'}",
                       "--save-outputs", str(tmp_path / "out"))
    assert rc == 0, err
    assert out.startswith("// @mlp: 1 output(s)\n%out0: float32[4, 8] =")
    np.testing.assert_allclose(np.load(tmp_path / "out" / "out0.npy"), np.tanh(x @ w.T + b), rtol=1e-5, atol=1e-6)


def test_run_after_the_cpu_pipeline_gives_the_same_outputs(tmp_path: Path) -> None:
    import numpy as np

    results = {}
    for tag, extra in (("plain", []), ("cpu", ["--passes", FULL_CPU]), ("seed8", [])):
        seed = "8" if tag == "seed8" else "7"
        rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--run", "--seed", seed, *extra,
                           "--save-outputs", str(tmp_path / tag))
        assert rc == 0, err
        results[tag] = np.load(tmp_path / tag / "out0.npy")
    np.testing.assert_allclose(results["cpu"], results["plain"], rtol=1e-5, atol=1e-6)
    assert not np.allclose(results["seed8"], results["plain"])


def test_run_a_kernel_with_a_symbolic_size() -> None:
    rc, out, err = opt(str(DATA / "kernel.tbir"), "--run", "--sym", "s0=2")
    assert rc == 0, err
    assert "%out: float32[2, 16] =" in out
    rc, out, err = opt(str(DATA / "kernel.tbir"), "--run")
    assert rc == 1 and "give it with --sym" in err


def test_run_errors(tmp_path: Path) -> None:
    rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--run", "--input", "nope")
    assert rc == 2 and "expected NAME=VALUE" in err
    rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--run", "--input", f"y={tmp_path / 'missing.npy'}")
    assert rc == 2 and "cannot read it as .npy" in err
    import numpy as np

    np.save(tmp_path / "y.npy", np.zeros(3, np.float32))
    rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--run", "--input", f"y={tmp_path / 'y.npy'}")
    assert rc == 1 and "has no such input (inputs: x, w, b)" in err


BROKEN_LOOP_PASS = '''
from dataclasses import dataclass
from typing import ClassVar
from torchburn.ir import expr as ex
from torchburn.ir.transform import StmtMutator
from torchburn.passes import register_pass
from torchburn.passes.base import LoopPass

class _TanhToSigmoid(StmtMutator):
    def visit_Call(self, e):
        e = self.generic_visit(e)
        return ex.Call("sigmoid", e.args, e.type) if e.name == "tanh" else e

@register_pass
@dataclass(frozen=True)
class Miscompile(LoopPass):
    "Computes sigmoid where tanh is asked for: verifies, but computes something else."
    name: ClassVar[str] = "test-miscompile"

    def run(self, program):
        return program.with_kernels(tuple(_TanhToSigmoid().visit_kernel(k) for k in program.kernels))
'''


def test_run_after_each_finds_the_pass_that_changes_the_results(tmp_path: Path) -> None:
    plugin = tmp_path / "miscompile.py"
    plugin.write_text(BROKEN_LOOP_PASS)
    passes = "canonicalize,fuse,lower-to-loops,tile,test-miscompile,vectorize,simplify"
    rc, out, err = opt("--load-pass-plugin", str(plugin), str(DATA / "mlp_tensor.tbir"), "--passes", passes,
                       "--run-after-each")
    assert rc == 1, err
    lines = out.splitlines()
    assert "// after pass 4 (tile): same results" in lines
    assert any(ln.startswith("// after pass 5 (test-miscompile): results CHANGED: output 0:") for ln in lines)
    assert lines[-1] == "// @mlp: first pass after which the results change: pass 5 (test-miscompile)"
    rc, out, err = opt(str(DATA / "mlp_tensor.tbir"), "--passes", FULL_CPU, "--run-after-each")
    assert rc == 0, err
    assert out.splitlines()[-1] == "// @mlp: first pass after which the results change: none"
