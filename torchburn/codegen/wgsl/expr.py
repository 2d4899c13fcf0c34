"""Render loop-IR expressions as WGSL text, using the tables in `ops.py`.

`ExprRenderer.render(e)` returns `(text, lanes)`: lanes is 1 for scalars and 4 in vectorized
elementwise code, where a varying value is a `vec4` and a uniform one is splatted where it
meets a vector. Loads and variables are resolved through callbacks of the kernel emitter,
which knows the buffers, the loop variables and which `let`s are vectors.
"""
from __future__ import annotations

import math
import struct
from typing import Callable, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import semantics as sem
from ...ir.dtypes import DType
from ...ir.expr import Expr
from . import ops
from .types import Caps, WgslUnsupported, value_type, vec

Rendered = tuple[str, int]
LoadFn = Callable[[ex.Load], Rendered]
VarFn = Callable[[ex.Var], Rendered]

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


def kind(d: DType) -> str:
    """"f", "i" or "b": the column of the op tables a dtype reads."""
    return "f" if d.is_float else "b" if d.is_bool else "i"


def mangle(wgsl_type: str) -> str:
    """`vec4<f32>` -> `vec4f32`: a type spelt for a function name."""
    return wgsl_type.replace("<", "").replace(">", "")


class Helpers:
    """The helper functions a shader uses, instantiated per type, in first-use order."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}

    def need(self, name: str, wgsl_type: str, lanes: int) -> None:
        key = f"{name}_{mangle(wgsl_type)}"
        if key in self.sources:
            return
        for dep in ops.HELPER_DEPS.get(name, ()):
            self.need(dep, wgsl_type, lanes)
        scalar = wgsl_type.split("<")[-1].rstrip(">")
        self.sources[key] = ops.fill(ops.HELPERS[name], T=wgsl_type, t=mangle(wgsl_type),
                                     U=vec("u32", lanes), F=vec("f32", lanes), S=scalar,
                                     ROUND16=ops.ROUND16[lanes], TRUNC="trunc" if scalar[0] == "f" else "")

    def text(self) -> str:
        return "\n".join(self.sources.values())


def _helpers_in(text: str) -> list[str]:
    out: list[str] = []
    start = 0
    while True:
        i = text.find("tb_", start)
        if i < 0:
            return out
        j = text.find("_$t", i)
        if j < 0:
            return out
        out.append(text[i + 3:j])
        start = j + 3


class ExprRenderer:
    """Renders expressions of one kernel (see the module docstring)."""

    def __init__(self, caps: Caps, helpers: Helpers, load: LoadFn, var: VarFn) -> None:
        self.caps = caps
        self.helpers = helpers
        self._load = load
        self._var = var
        #: Integer variables known to be >= 0 (loop variables, sizes, strides): index
        #: arithmetic on them divides unsigned instead of through the Python-rounding helpers.
        self.nonneg: set[str] = set()

    def is_nonneg(self, e: Expr) -> bool:
        if isinstance(e, ex.Const):
            return e.dtype.is_int and int(e.value) >= 0
        if isinstance(e, ex.Var):
            return e.name in self.nonneg
        if isinstance(e, ex.Binary) and e.op in ("add", "mul", "floordiv", "mod", "min", "max"):
            return self.is_nonneg(e.a) and self.is_nonneg(e.b)
        return False

    # ---- types ------------------------------------------------------------------------------------
    def wtype(self, d: DType, lanes: int = 1) -> str:
        return vec(value_type(d, self.caps), lanes)

    def _subs(self, d: DType, lanes: int, template: str) -> dict[str, str]:
        t = self.wtype(d, lanes)
        for name in _helpers_in(template):
            self.helpers.need(name, t, lanes)
        return {"T": t, "t": mangle(t), "U": vec("u32", lanes), "F": vec("f32", lanes),
                "I": vec("i32", lanes), "S": self.wtype(d, 1)}

    # ---- expressions ------------------------------------------------------------------------------
    def render(self, e: Expr) -> Rendered:
        if e.type.lanes != 1:
            raise WgslUnsupported(f"vector IR ({e.type}) reaches WGSL codegen; run no CPU vectorizer before it")
        method = getattr(self, "_" + type(e).__name__, None)
        if method is None:
            raise WgslUnsupported(f"expression {type(e).__name__} has no WGSL form")
        return method(e)

    def scalar(self, e: Expr) -> str:
        """Render an expression that must be a scalar (an index, a loop bound)."""
        text, lanes = self.render(e)
        if lanes != 1:
            raise WgslUnsupported("a vectorized value is used as an index")
        return text

    def splat(self, r: Rendered, d: DType, lanes: int) -> str:
        text, have = r
        return text if have == lanes else f"{self.wtype(d, lanes)}({text})"

    def _Const(self, e: ex.Const) -> Rendered:
        return const_text(e.value, e.dtype, self.caps), 1

    def _Var(self, e: ex.Var) -> Rendered:
        return self._var(e)

    def _Load(self, e: ex.Load) -> Rendered:
        return self._load(e)

    def _Binary(self, e: ex.Binary) -> Rendered:
        d = e.a.dtype
        template = _template(ops.BINARY, e.op, d, "binary op")
        a, b = self.render(e.a), self.render(e.b)
        lanes = max(a[1], b[1])
        if e.op in ("floordiv", "mod") and d.is_int and lanes == 1 and self.is_nonneg(e.a) and self.is_nonneg(e.b):
            op = "/" if e.op == "floordiv" else "%"
            return self.narrow(f"i32(u32({a[0]}) {op} u32({b[0]}))", e.op, d, 1), 1
        subs = self._subs(d, lanes, template)
        text = ops.fill(template, a=self.splat(a, d, lanes), b=self.splat(b, d, lanes), **subs)
        return self.narrow(text, e.op, d, lanes), lanes

    def _Call(self, e: ex.Call) -> Rendered:
        d = e.args[0].dtype
        table = ops.UNARY if len(e.args) == 1 else ops.CALLS
        template = _template(table, e.name, d, "function")
        args = [self.render(a) for a in e.args]
        lanes = max(r[1] for r in args)
        subs = self._subs(d, lanes, template)
        texts = [self.splat(r, a.dtype, lanes) for r, a in zip(args, e.args)]
        names = dict(zip(("x",) if len(texts) == 1 else ("a", "b", "c"), texts))
        return self.narrow(ops.fill(template, **names, **subs), e.name, d, lanes), lanes

    def narrow(self, text: str, op: str, d: DType, lanes: int) -> str:
        """Wrap the i32 result of `op` back into i8/i16/u8 where it can leave the range."""
        if d.name not in ("i8", "i16", "u8") or op not in ops.WRAPS_NARROW:
            return text
        template = ops.CASTS[("i", d.name)]
        return ops.fill(template, x=text, **self._subs(d, lanes, template))

    def _Select(self, e: ex.Select) -> Rendered:
        c, a, b = self.render(e.cond), self.render(e.a), self.render(e.b)
        lanes = max(c[1], a[1], b[1])
        d = e.dtype
        return (f"select({self.splat(b, d, lanes)}, {self.splat(a, d, lanes)}, "
                f"{self.splat(c, dt.bool_, lanes)})"), lanes

    def _Cast(self, e: ex.Cast) -> Rendered:
        src, dst = e.value.dtype, e.dtype
        x = self.render(e.value)
        lanes = x[1]
        target = cast_target(dst, self.caps)
        template = ops.CASTS.get((kind(src), target))
        if template is None:
            raise WgslUnsupported(f"cast from {src} to {dst} has no WGSL form")
        # `$T` is the target type; helpers named in the template are instantiated for it.
        subs = self._subs(dst, lanes, template)
        subs["S"] = self.wtype(src, lanes)
        return ops.fill(template, x=x[0], **subs), lanes

    def _Bitcast(self, e: ex.Bitcast) -> Rendered:
        if e.value.dtype == dt.i16 and e.dtype == dt.f16 and e.lanes == 1:
            # a float16 read from its bytes (the scales of ggml blocks, `ir/qblocks.py`): the
            # i16 is an i32 here, its low 16 bits the half's
            x, _ = self.render(e.value)
            value = f"unpack2x16float(u32({x}) & 0xffffu).x"
            return (f"{self.wtype(e.dtype, 1)}({value})" if self.wtype(e.dtype, 1) != "f32" else value), 1
        if {e.value.dtype, e.dtype} == {dt.u8, dt.i8}:
            # both are i32 here: re-read the low byte signed (i8) or unsigned (u8)
            x, lanes = self.render(e.value)
            if e.dtype == dt.u8:
                mask = "255" if lanes == 1 else f"vec{lanes}<i32>(255)"
                return f"({x} & {mask})", lanes
            by = "24u" if lanes == 1 else f"vec{lanes}<u32>(24u)"
            return f"(({x} << {by}) >> {by})", lanes
        if e.dtype.bits != 32 or e.value.dtype.bits != 32:
            raise WgslUnsupported(f"bitcast {e.value.dtype} -> {e.dtype}: only 32-bit bitcasts exist in WGSL")
        x, lanes = self.render(e.value)
        return f"bitcast<{self.wtype(e.dtype, lanes)}>({x})", lanes


def _template(table: dict[tuple[str, str], str], op: str, d: DType, what: str) -> str:
    """The template of `op` on `d`, or `WgslUnsupported` with the table's reason."""
    reason = ops.UNSUPPORTED_DTYPES.get(d.name) or ops.UNSUPPORTED.get((op, kind(d)))
    if reason is not None:
        raise WgslUnsupported(f"{what} {op!r} on {d}: {reason}")
    template = table.get((op, kind(d)))
    if template is None:
        raise WgslUnsupported(f"{what} {op!r} on {d} has no WGSL form")
    return template


def handles(op: str, d: DType) -> bool:
    """Whether the WGSL renderer has an entry (a template or an unsupported reason) for `op`
    on `d`: the WGSL interpretation of `ir/semantics.py`'s ops."""
    if d.name in ops.UNSUPPORTED_DTYPES or (op, kind(d)) in ops.UNSUPPORTED:
        return True
    if op in ex.BINARY_OPS:
        return (op, kind(d)) in ops.BINARY
    if op in ex.UNARY_FUNCS:
        return (op, kind(d)) in ops.UNARY
    if op in ("cast", "bitcast", "select"):
        return True  # `_Cast` (the CASTS table, `cast_target` says why not), `_Bitcast`, `_Select`
    return (op, kind(d)) in ops.CALLS


sem.register_interpretation("wgsl", handles)


def cast_target(d: DType, caps: Caps) -> str:
    """The column of `ops.CASTS` a cast to `d` uses."""
    if d == dt.f16:
        return "float" if caps.f16 else "f16r"
    if d == dt.bf16:
        return "bf16r"
    if d.is_float:
        if d == dt.f64:
            raise WgslUnsupported("WGSL has no 64-bit floats (f64)")
        return "float"
    if d.is_bool:
        return "bool"
    if d.name in ("i32", "i64"):
        return "i32"
    if d.name in ("u8", "i8", "i16"):
        return d.name
    raise WgslUnsupported(f"cast to {d} has no WGSL form")


def _f32_repr(v: float) -> Optional[str]:
    """Shortest decimal that rounds to the f32 nearest `v`, or None when that is not finite."""
    try:
        f = struct.unpack("<f", struct.pack("<f", v))[0]
    except OverflowError:
        return None
    if math.isinf(f) or math.isnan(f):
        return None
    text = repr(f)
    # Widen to the shortest round-tripping form for f32 when Python's f64 repr is long.
    for digits in range(6, 10):
        short = f"{f:.{digits}g}"
        if struct.unpack("<f", struct.pack("<f", float(short)))[0] == f:
            text = short
            break
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    return text


def const_text(value: object, d: DType, caps: Caps) -> str:
    """A WGSL literal of dtype `d` (inf and NaN become runtime values)."""
    t = value_type(d, caps)
    if d.is_bool:
        return "true" if value else "false"
    if d.is_float:
        v = float(value)  # type: ignore[arg-type]
        if math.isnan(v):
            return f"{t}(tb_nan())"
        if t == "f16" and abs(v) > 65504.0:
            v = math.copysign(math.inf, v)
        text = _f32_repr(v) if not math.isinf(v) else None
        if text is None:
            return f"{t}({'-' if v < 0 else ''}tb_inf())"
        return f"{t}({text})"
    iv = int(value)  # type: ignore[call-overload]
    if d.name == "u8":
        iv &= 0xFF
    if not I32_MIN <= iv <= I32_MAX:
        raise WgslUnsupported(f"integer constant {iv} does not fit in 32 bits (WGSL has no 64-bit integers)")
    if iv == I32_MIN:
        return "i32(-2147483647 - 1)"
    return f"{iv}i" if iv >= 0 else f"(-{-iv}i)"
