"""The WGSL renderer's tables: IR operation -> WGSL template.

Templates are `string.Template`s. Operands are `$a`, `$b`, `$x`; types are `$T` (the operand's
WGSL type, a vector type in vectorized code), `$t` (the same, spelled for a function name),
`$F` (f32 with the operand's lanes), `$U` (u32 with its lanes), `$I` (i32 with its lanes).
A template naming `tb_<helper>_$t` pulls in the helper function of that name from `HELPERS`,
instantiated for the type.

Each table is keyed by (operation, kind) where kind is "f" (float), "i" (integer) or "b" (bool),
operations by the IR's names (`ir/opnames.py`); what they compute is `ir/semantics.py`'s.
Operations WGSL cannot express have an explicit entry in `UNSUPPORTED` (with the reason), as
do whole dtypes (`UNSUPPORTED_DTYPES`): codegen raises `WgslUnsupported` with that reason and
the program runs on the CPU engine. `tests/codegen/test_handler_coverage.py` checks that every
op the semantics define has one or the other.

Integers narrower than 32 bits (i8, i16, u8) are held in i32: the ops in `WRAPS_NARROW` can
leave the type's range, and their result is wrapped back with the cast templates, so i8
`100 + 100` is -56 as on the CPU.
"""
from __future__ import annotations

from string import Template

#: Infix and named binary operations.
BINARY: dict[tuple[str, str], str] = {}
for _k in ("f", "i"):
    BINARY.update({
        ("add", _k): "($a + $b)", ("sub", _k): "($a - $b)", ("mul", _k): "($a * $b)",
        ("div", _k): "($a / $b)", ("min", _k): "min($a, $b)", ("max", _k): "max($a, $b)",
    })
for _k in ("f", "i", "b"):
    BINARY.update({("eq", _k): "($a == $b)", ("ne", _k): "($a != $b)"})
for _k in ("f", "i"):
    BINARY.update({("lt", _k): "($a < $b)", ("le", _k): "($a <= $b)",
                   ("gt", _k): "($a > $b)", ("ge", _k): "($a >= $b)"})
BINARY.update({
    # floats
    ("floordiv", "f"): "floor($a / $b)",
    ("mod", "f"): "tb_pymod_$t($a, $b)",
    ("remainder", "f"): "tb_pymod_$t($a, $b)",
    ("fmod", "f"): "tb_fmod_$t($a, $b)",
    ("pow", "f"): "tb_pow_$t($a, $b)",
    ("atan2", "f"): "atan2($a, $b)",
    ("copysign", "f"): "tb_copysign_$t($a, $b)",
    ("hypot", "f"): "sqrt($a * $a + $b * $b)",
    # integers (Python rounding for floordiv and mod; `div` truncates)
    ("floordiv", "i"): "tb_floordiv_$t($a, $b)",
    ("mod", "i"): "tb_pymod_$t($a, $b)",
    ("remainder", "i"): "tb_pymod_$t($a, $b)",
    ("fmod", "i"): "tb_rem_$t($a, $b)",
    ("and", "i"): "($a & $b)", ("or", "i"): "($a | $b)", ("xor", "i"): "($a ^ $b)",
    # shift amounts of the bit width or more give 0 (sign bits for `>>`), not WGSL's modulo
    ("shl", "i"): "select($a << $U($b), $T(0), $U($b) >= $U(32u))",
    ("shr", "i"): "($a >> min($U($b), $U(31u)))",
    # bools
    ("and", "b"): "($a & $b)", ("or", "b"): "($a | $b)", ("xor", "b"): "($a != $b)",
    ("min", "b"): "($a & $b)", ("max", "b"): "($a | $b)",
    ("add", "b"): "($a | $b)", ("mul", "b"): "($a & $b)",
    ("lt", "b"): "($I($a) < $I($b))", ("le", "b"): "($I($a) <= $I($b))",
    ("gt", "b"): "($I($a) > $I($b))", ("ge", "b"): "($I($a) >= $I($b))",
})

#: Functions of one argument.
UNARY: dict[tuple[str, str], str] = {
    ("neg", "f"): "(-$x)", ("neg", "i"): "(-$x)",
    ("not", "b"): "(!$x)", ("not", "i"): "(~$x)",
    ("abs", "f"): "abs($x)", ("abs", "i"): "abs($x)",
    ("sign", "f"): "sign($x)", ("sign", "i"): "sign($x)",
    ("exp", "f"): "exp($x)", ("exp2", "f"): "exp2($x)", ("expm1", "f"): "tb_expm1_$t($x)",
    ("log", "f"): "log($x)", ("log2", "f"): "log2($x)", ("log10", "f"): "(log2($x) * $T(0.30102999566398120))",
    ("log1p", "f"): "tb_log1p_$t($x)",
    ("sqrt", "f"): "sqrt($x)", ("rsqrt", "f"): "inverseSqrt($x)", ("reciprocal", "f"): "($T(1) / $x)",
    ("sin", "f"): "sin($x)", ("cos", "f"): "cos($x)", ("tan", "f"): "tan($x)",
    ("asin", "f"): "asin($x)", ("acos", "f"): "acos($x)", ("atan", "f"): "atan($x)",
    ("sinh", "f"): "sinh($x)", ("cosh", "f"): "cosh($x)",
    # tanh(x) is +-1 in f32 beyond |x| = 10; clamping avoids inf/inf in naive implementations.
    ("tanh", "f"): "tanh(clamp($x, $T(-10), $T(10)))",
    ("asinh", "f"): "asinh($x)", ("acosh", "f"): "acosh($x)", ("atanh", "f"): "atanh($x)",
    ("erf", "f"): "tb_erf_$t($x)", ("erfc", "f"): "tb_erfc_$t($x)",
    ("sigmoid", "f"): "($T(1) / ($T(1) + exp(-$x)))",
    ("floor", "f"): "floor($x)", ("ceil", "f"): "ceil($x)", ("round", "f"): "round($x)", ("trunc", "f"): "trunc($x)",
    ("floor", "i"): "$x", ("ceil", "i"): "$x", ("round", "i"): "$x", ("trunc", "i"): "$x",
    ("isnan", "f"): "((bitcast<$U>($F($x)) & $U(0x7fffffffu)) > $U(0x7f800000u))",
    ("isinf", "f"): "((bitcast<$U>($F($x)) & $U(0x7fffffffu)) == $U(0x7f800000u))",
    ("isfinite", "f"): "((bitcast<$U>($F($x)) & $U(0x7f800000u)) != $U(0x7f800000u))",
    ("signbit", "f"): "((bitcast<$U>($F($x)) >> $U(31u)) != $U(0u))",
    ("isnan", "i"): "($x != $x)", ("isinf", "i"): "($x != $x)", ("isfinite", "i"): "($x == $x)",
    ("signbit", "i"): "($x < $T(0))",
    ("abs", "b"): "$x", ("sign", "b"): "$x",
    ("floor", "b"): "$x", ("ceil", "b"): "$x", ("round", "b"): "$x", ("trunc", "b"): "$x",
    ("isnan", "b"): "($x != $x)", ("isinf", "b"): "($x != $x)", ("isfinite", "b"): "($x == $x)",
    ("signbit", "b"): "($x != $x)",
}

#: Other calls, by name and kind (arguments `$a`, `$b`, `$c`).
CALLS: dict[tuple[str, str], str] = {
    ("fma", "f"): "fma($a, $b, $c)",
    ("fma", "i"): "($a * $b + $c)",
    # an index out of range is 0 and sets the program's fault flag (`tb_fault`, bound after the
    # kernel's buffers); the launcher reads the flag with the results and PyTorch raises
    ("checked_index", "i"): "tb_checked_$t($a, $b)",
}

#: Operations with no WGSL form, and why: (operation, kind) -> reason.
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("lgamma", "f"): "lgamma has no WGSL form (no built-in, no helper yet)",
    ("digamma", "f"): "digamma has no WGSL form (no built-in, no helper yet)",
    ("erfinv", "f"): "erfinv has no WGSL form (no built-in, no helper yet)",
    ("nextafter", "f"): "nextafter has no WGSL form (no bit-stepping helper yet)",
    ("pow", "i"): "integer pow has no WGSL form (WGSL's pow is float-only)",
    ("dot4_u8i8_acc", "i"): "dot4_u8i8_acc has no WGSL form (CPU quantized kernels only)",
    ("dot4_i8i8_acc", "i"): "dot4_i8i8_acc has no WGSL form (CPU quantized kernels only)",
    ("tile_dot_u8i8", "i"): "tile_dot_u8i8 has no WGSL form (CPU quantized kernels only)",
    ("tile_dot_i8i8", "i"): "tile_dot_i8i8 has no WGSL form (CPU quantized kernels only)",
}
#: Dtypes no WGSL operation takes, and why. (i64 is not among them: i64 values exist only in
#: index arithmetic, computed in i32; the launcher range-checks the sizes, see `types.py`.)
UNSUPPORTED_DTYPES: dict[str, str] = {"f64": "WGSL has no 64-bit floats (f64)"}

#: Integer ops whose i32 result can leave the range of i8/i16/u8 operands (then wrapped).
WRAPS_NARROW: frozenset[str] = frozenset(
    {"add", "sub", "mul", "div", "floordiv", "shl", "neg", "abs", "not", "fma"}
)

#: Conversions: (source kind, target spelling) -> template; `$T` is the target WGSL type.
#: Targets: "float" (f32/f16 natively), "f16r" (f16 kept in f32: round), "bf16r" (bf16 kept in
#: f32: round), "bool", "i32", "u8", "i8", "i16".
CASTS: dict[tuple[str, str], str] = {
    **{(k, "float"): "$T($x)" for k in "fib"},
    **{(k, "f16r"): "tb_f16r_$t($F($x))" for k in "fib"},
    **{(k, "bf16r"): "tb_bf16r_$t($F($x))" for k in "fib"},
    ("f", "bool"): "($x != $S(0))", ("i", "bool"): "($x != $S(0))", ("b", "bool"): "$x",
    **{(k, "i32"): "$T($x)" for k in "fib"},
    **{(k, "u8"): "($T($x) & $T(255))" for k in "fib"},
    **{(k, "i8"): "(($T($x) << $U(24u)) >> $U(24u))" for k in "fib"},
    **{(k, "i16"): "(($T($x) << $U(16u)) >> $U(16u))" for k in "fib"},
}

#: Helper functions, instantiated per WGSL type (`$T`, function-name spelling `$t`).
#: `tb_inf` and `tb_nan` are runtime values (a const-expression may not be inf or NaN).
HELPERS: dict[str, str] = {
    "checked": """fn tb_checked_$t(i: $T, n: $T) -> $T {
  if (i < $T(0) || i >= n) {
    tb_fault[0] = 1u;
    return $T(0);
  }
  return i;
}""",
    "floordiv": """fn tb_floordiv_$t(a: $T, b: $T) -> $T {
  let q = a / b;
  return select(q, q - $T(1), ((a - q * b) != $T(0)) & ((a < $T(0)) != (b < $T(0))));
}""",
    # Remainders are written out: naga's GLSL output gives `%` other semantics than WGSL's.
    "rem": """fn tb_rem_$t(a: $T, b: $T) -> $T {
  return a - b * (a / b);
}""",
    "fmod": """fn tb_fmod_$t(a: $T, b: $T) -> $T {
  return a - b * trunc(a / b);
}""",
    "pymod": """fn tb_pymod_$t(a: $T, b: $T) -> $T {
  let r = a - b * $TRUNC(a / b);
  return select(r, r + b, (r != $T(0)) & ((r < $T(0)) != (b < $T(0))));
}""",
    "pow": """fn tb_pow_$t(a: $T, b: $T) -> $T {
  let m = pow(abs(a), b);
  let whole = b == trunc(b);
  let odd = whole & (abs(b - $T(2) * trunc(b / $T(2))) == $T(1));
  var r = select(m, select(m, -m, odd), a < $T(0));
  r = select(r, $T(tb_nan()), (a < $T(0)) & !whole);
  return select(r, $T(1), b == $T(0));
}""",
    "copysign": """fn tb_copysign_$t(a: $T, b: $T) -> $T {
  let bits = (bitcast<$U>($F(a)) & $U(0x7fffffffu)) | (bitcast<$U>($F(b)) & $U(0x80000000u));
  return $T(bitcast<$F>(bits));
}""",
    "expm1": """fn tb_expm1_$t(x: $T) -> $T {
  let series = x * ($T(1) + x * ($T(0.5) + x * ($T(1.0 / 6.0) + x * $T(1.0 / 24.0))));
  return select(exp(x) - $T(1), series, abs(x) < $T(0.01));
}""",
    "log1p": """fn tb_log1p_$t(x: $T) -> $T {
  let series = x * ($T(1) - x * ($T(0.5) - x * ($T(1.0 / 3.0) - x * $T(0.25))));
  return select(log($T(1) + x), series, abs(x) < $T(0.01));
}""",
    # Abramowitz & Stegun 7.1.26: |error| < 1.5e-7.
    "erfc_pos": """fn tb_erfc_pos_$t(ax: $T) -> $T {
  let t = $T(1) / ($T(1) + $T(0.3275911) * ax);
  let p = t * ($T(0.254829592) + t * ($T(-0.284496736) + t * ($T(1.421413741)
          + t * ($T(-1.453152027) + t * $T(1.061405429)))));
  return p * exp(-ax * ax);
}""",
    "erf": """fn tb_erf_$t(x: $T) -> $T {
  return sign(x) * ($T(1) - tb_erfc_pos_$t(abs(x)));
}""",
    "erfc": """fn tb_erfc_$t(x: $T) -> $T {
  let e = tb_erfc_pos_$t(abs(x));
  return select(e, $T(2) - e, x < $T(0));
}""",
    "f16r": """fn tb_f16r_$t(x: $T) -> $T {
  return $ROUND16;
}""",
    "bf16r": """fn tb_bf16r_$t(x: $T) -> $T {
  let u = bitcast<$U>(x);
  return bitcast<$T>((u + $U(0x7fffu) + ((u >> $U(16u)) & $U(1u))) & $U(0xffff0000u));
}""",
}

#: Helpers that call other helpers.
HELPER_DEPS: dict[str, tuple[str, ...]] = {"erf": ("erfc_pos",), "erfc": ("erfc_pos",)}

#: f16 rounding of f32 values through pack2x16float (available without shader-f16).
ROUND16 = {
    1: "unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x",
    2: "unpack2x16float(pack2x16float(x))",
    4: "vec4<f32>(unpack2x16float(pack2x16float(x.xy)), unpack2x16float(pack2x16float(x.zw)))",
}

#: Module-scope prelude: runtime inf and NaN (reading a private variable is not a
#: const-expression, so these are not folded at shader creation).
PRELUDE = """var<private> tb_zero: u32;
fn tb_inf() -> f32 { return bitcast<f32>(0x7f800000u + tb_zero); }
fn tb_nan() -> f32 { return bitcast<f32>(0x7fc00000u + tb_zero); }"""

#: Tree-reduction combine of a cooperative reduction: op -> template over `$a`, `$b`.
COMBINE: dict[str, str] = {
    "add": "($a + $b)", "mul": "($a * $b)", "min": "min($a, $b)", "max": "max($a, $b)",
    "and": "($a & $b)", "or": "($a | $b)",
}


def fill(template: str, **subs: str) -> str:
    return Template(template).substitute(subs)
