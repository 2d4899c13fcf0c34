"""Reads the text form that `printer.py` writes, for both IR levels: `parse(print(ir)) == ir`.

Text is the lingua franca of tests and tools (a pass test reads IR text, runs the pass and
compares against expected text), so the parser is exact rather than forgiving: it rebuilds the
very nodes the printer printed, types included, and reports problems with file, line, column
and a caret under the offending spot.

Entry points:

- `parse_expr(text)`, `parse_stmt(text)`: one expression / a list of loop statements.
- `parse_graph(text)`, `parse_kernel(text)`, `parse_program(text)`: exactly one item of that
  kind (a program together with the kernel definitions printed after it).
- `parse(text)`: whatever the text holds; one item comes back as itself, several as a list in
  text order. `parse_all(text)` always returns the list.

A `program` owns every `kernel` definition that follows it up to the next `graph` or
`program` (that is how the printer writes a program), so a stand-alone kernel in a file with a
program must come before the program.

Types are not printed inside expressions; they are inferred the way the builders in `expr.py`
do: variables are i64 unless a `let` in scope bound them to another type, a load has its
buffer's dtype and its index's lanes, comparisons and the predicates `isnan`, `isinf`,
`isfinite`, `signbit` give bool, everything else keeps its first operand's type. Constants
carry their type in the text (`3` is i64, `3:i32`, `1.5:f32`, `true`, `-inf:f64`). Expressions
are built node by node, never through the folding helpers, so `1 + 2` stays `1 + 2`.
Tensor-level result types are taken from the text as written; `verifier.py` checks them.

Comments run from `//` to the end of the line. Because `//` also spells floor division, a
`//` directly after an operand on the same line (where an operator may stand) is division;
everywhere else, and always at the start of a line, it opens a comment. So a comment after an
expression that ends a statement (`let t = x // note`) must go on its own line.

Attribute values: `1` is an int, `1.5`, `inf`, `nan` are floats, `true`/`false` bools,
`"s"` strings (JSON escapes), `f32` a dtype, `none` None, `[a, b]` a tuple, and anything else
(`s0`, `s0 * 2`, `(3:i32)`) an index `Expr`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Generator, Mapping, Optional, TypeVar, Union

from . import dtypes as dt
from . import expr as ex
from . import loop as lp
from .dtypes import DType
from .printer import PRECEDENCE
from .tensor import Graph, Op, TensorType, Value

T = TypeVar("T")
IR = Union[Graph, lp.Kernel, lp.Program]


class IRParseError(ValueError):
    """Text that is not valid IR; `str()` gives `file:line:col: message` and a caret line."""

    def __init__(self, message: str, filename: str, line: int, col: int, source_line: str) -> None:
        self.message = message
        self.filename = filename
        self.line = line
        self.col = col
        self.source_line = source_line
        pad = "".join(c if c == "\t" else " " for c in source_line[: col - 1])
        super().__init__(f"{filename}:{line}:{col}: {message}\n  {source_line}\n  {pad}^")

    def __reduce__(self) -> tuple[object, ...]:  # picklable despite the custom signature
        return (IRParseError, (self.message, self.filename, self.line, self.col, self.source_line))


# --------------------------------------------------------------------------------------------
# Lexer

@dataclass(frozen=True)
class Token:
    """One token. `kind` is `ident`, `number`, `string`, `value` (%name), `func` (@name),
    `eof`, `error`, or the punctuation itself (`(`, `..`, `//`, ...)."""

    kind: str
    text: str
    line: int
    col: int
    start: int
    end: int

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of input"
        return repr(self.text)


_NAME = r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*"
_TOKEN_RE = re.compile(
    r"(?P<ws>[ \t\r\f\v]+)"
    r"|(?P<nl>\n)"
    r'|(?P<string>"(?:[^"\\\n]|\\.)*")'
    r"|(?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
    rf"|(?P<value>%{_NAME})"
    rf"|(?P<func>@{_NAME})"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r"|(?P<punct>\.\.|->|==|!=|<=|>=|<<|>>|//|[-+*/%<>&|^=()\[\]{},:])"
)


def _lex(text: str) -> list[Token]:
    """Split text into tokens. Characters that fit no token become `error` tokens instead of
    failing at once, because they may sit inside a comment the parser will skip."""
    toks: list[Token] = []
    pos, line, line_start = 0, 1, 0
    at_line_start = True
    n = len(text)
    while pos < n:
        col = pos - line_start + 1
        if at_line_start and text.startswith("//", pos):
            nl = text.find("\n", pos)
            pos = n if nl < 0 else nl
            continue
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            toks.append(Token("error", text[pos], line, col, pos, pos + 1))
            pos += 1
            at_line_start = False
            continue
        kind = m.lastgroup
        assert kind is not None
        if kind == "nl":
            line += 1
            line_start = m.end()
            at_line_start = True
        elif kind != "ws":
            t = m.group()
            if kind == "punct":
                kind = t
            elif kind in ("value", "func"):
                t = t[1:]
            toks.append(Token(kind, t, line, col, pos, m.end()))
            at_line_start = False
        pos = m.end()
    toks.append(Token("eof", "", line, n - line_start + 1, n, n))
    return toks


#: Infix spelling -> (precedence, op name), from the printer's table so the two never drift.
#: A sub-parse written as a generator (see `_Parser.expr`): it yields the sub-parses it needs
#: and returns its result.
_Parse = Generator["_Parse", object, object]


def _run(parse: _Parse) -> Any:
    """Run a generator parse and its sub-parses with an explicit stack: each yielded generator
    runs to its end and its result is sent back to the one that asked for it."""
    stack = [parse]
    value: object = None
    while True:
        try:
            sub = stack[-1].send(value)
        except StopIteration as done:
            stack.pop()
            if not stack:
                return done.value
            value = done.value
            continue
        stack.append(sub)
        value = None


_INFIX: dict[str, tuple[int, str]] = {sym: (PRECEDENCE[name], name) for name, sym in ex.INFIX_OPS.items()}
_PREDICATES = frozenset({"isnan", "isinf", "isfinite", "signbit"})


# --------------------------------------------------------------------------------------------
# Parser

class _Parser:
    """Recursive descent over the token list, with scopes for `let` types and buffers."""

    def __init__(self, text: str, filename: str) -> None:
        self.filename = filename
        self.lines = text.split("\n")
        self.toks = _lex(text)
        self.pos = 0
        #: Innermost last: names bound by `let` (and loops) to their types.
        self.var_scopes: list[dict[str, ex.ScalarType]] = [{}]
        #: Bodies (`{ ... }`) open around the current token; a kernel's own body is the first.
        self.nesting = 0
        #: Innermost last: buffers (params, temps, allocs) visible to loads, by name.
        self.buf_scopes: list[dict[str, DType]] = [{}]
        #: Tensor values of the graph being parsed.
        self.values: dict[str, Value] = {}

    # ---- token access ----------------------------------------------------------------------
    def error(self, message: str, tok: Optional[Token] = None) -> IRParseError:
        tok = tok or self.peek()
        if tok.kind == "error":  # whatever was expected, the real problem is the character
            message = f"unexpected character {tok.text!r}"
        src = self.lines[tok.line - 1].rstrip("\r") if tok.line - 1 < len(self.lines) else ""
        return IRParseError(message, self.filename, tok.line, tok.col, src)

    def peek(self, operator: bool = False) -> Token:
        """The next token, skipping comments. With `operator`, a `//` followed by more tokens
        on its line is floor division, not a comment (see the module doc)."""
        while True:
            tok = self.toks[self.pos]
            if tok.kind != "//":
                return tok
            nxt = self.toks[self.pos + 1]
            if operator and nxt.kind != "eof" and nxt.line == tok.line:
                return tok
            while self.toks[self.pos].kind != "eof" and self.toks[self.pos].line == tok.line:
                self.pos += 1

    def raw(self, offset: int) -> Token:
        """The token `offset` places after the current one, comments not skipped."""
        return self.toks[min(self.pos + offset, len(self.toks) - 1)]

    def advance(self) -> Token:
        tok = self.peek(operator=True)
        if tok.kind == "error":
            raise self.error("", tok)
        self.pos += 1
        return tok

    def at(self, kind: str, text: Optional[str] = None) -> bool:
        tok = self.peek()
        return tok.kind == kind and (text is None or tok.text == text)

    def at_keyword(self, word: str) -> bool:
        return self.at("ident", word)

    def accept(self, kind: str, text: Optional[str] = None) -> bool:
        if self.at(kind, text):
            self.advance()
            return True
        return False

    def expect(self, kind: str, what: Optional[str] = None) -> Token:
        tok = self.peek()
        if tok.kind != kind:
            raise self.error(f"expected {what or repr(kind)} but found {tok.describe()}", tok)
        return self.advance()

    def expect_keyword(self, word: str) -> Token:
        tok = self.peek()
        if tok.kind != "ident" or tok.text != word:
            raise self.error(f"expected '{word}' but found {tok.describe()}", tok)
        return self.advance()

    def ident(self, what: str = "a name") -> str:
        return self.expect("ident", what).text

    def comma_list(self, item: Callable[[], T], close: str) -> list[T]:
        """`item, item, ...` up to and including the `close` token."""
        items: list[T] = []
        if not self.accept(close):
            items.append(item())
            while self.accept(","):
                items.append(item())
            self.expect(close)
        return items

    def value_names(self, what: str) -> tuple[str, ...]:
        """`%a, %b, ...`: one name or more, separated by commas."""
        names = [self.expect("value", what).text]
        while self.accept(","):
            names.append(self.expect("value", what).text)
        return tuple(names)

    def expect_end(self) -> None:
        tok = self.peek()
        if tok.kind != "eof":
            raise self.error(f"unexpected {tok.describe()} after the end", tok)

    # ---- scopes ----------------------------------------------------------------------------
    def push(self) -> None:
        self.var_scopes.append({})
        self.buf_scopes.append({})

    def pop(self) -> None:
        self.var_scopes.pop()
        self.buf_scopes.pop()

    def var_type(self, name: str) -> ex.ScalarType:
        for scope in reversed(self.var_scopes):
            if name in scope:
                return scope[name]
        return ex.INDEX

    def buffer_dtype(self, name: str, tok: Token) -> DType:
        for scope in reversed(self.buf_scopes):
            if name in scope:
                return scope[name]
        raise self.error(f"load from unknown buffer %{name}", tok)

    # ---- types -----------------------------------------------------------------------------
    def dtype(self) -> DType:
        tok = self.expect("ident", "a dtype")
        try:
            return dt.dtype_from_name(tok.text)
        except ValueError as e:
            raise self.error(str(e), tok) from None

    def dims(self) -> tuple[ex.Expr, ...]:
        self.expect("[")
        return tuple(self.comma_list(self.expr, "]"))

    def tensor_type(self) -> TensorType:
        dtype = self.dtype()
        return TensorType(dtype, self.dims())

    # ---- expressions -----------------------------------------------------------------------
    # Expressions nest without bound (a fused chain of thousands of ops is one expression), so
    # their grammar is written as generators run by `_run`: `x = yield self._atom()` asks for
    # a sub-parse, and the parse stack lives in a list rather than on Python's call stack.
    def expr(self, min_prec: int = 1) -> ex.Expr:
        """One expression whose infix operators bind at least as tightly as `min_prec`."""
        return _run(self._expr(min_prec))

    def _expr(self, min_prec: int = 1) -> _Parse:
        """Precedence climbing; every infix operator is left-associative, as printed."""
        lhs = yield self._atom()
        while True:
            tok = self.peek(operator=True)
            info = _INFIX.get(tok.kind)
            if info is None or info[0] < min_prec:
                return lhs
            prec, op = info
            self.advance()
            rhs = yield self._expr(prec + 1)
            lhs = ex.Binary(op, lhs, rhs, _binary_type(op, lhs))

    def _expr_list(self, close: str) -> _Parse:
        """`expr, expr, ...` up to and including `close` (`comma_list` for expressions)."""
        items: list[ex.Expr] = []
        if not self.accept(close):
            items.append((yield self._expr()))
            while self.accept(","):
                items.append((yield self._expr()))
            self.expect(close)
        return items

    def _atom(self) -> _Parse:
        tok = self.peek()
        if tok.kind == "-":
            nxt = self.raw(1)
            if nxt.kind == "number" or (nxt.kind == "ident" and nxt.text in ("inf", "nan")):
                self.advance()
                return self.literal(negative=True)
            raise self.error("expected a number after '-' (negation is written neg(x))", nxt)
        if tok.kind == "number":
            return self.literal(negative=False)
        if tok.kind == "(":
            self.advance()
            e = yield self._expr()
            self.expect(")")
            return e
        if tok.kind == "value":
            return (yield self._load())
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                self.advance()
                return ex.Const(tok.text == "true", ex.BOOL)
            if tok.text in ("inf", "nan"):
                return self.literal(negative=False)
            if self.raw(1).kind == "(" or (tok.text in ("cast", "bitcast") and self.raw(1).kind == "<"):
                return (yield self._call())
            self.advance()
            return ex.Var(tok.text, self.var_type(tok.text))
        raise self.error(f"expected an expression but found {tok.describe()}", tok)

    def literal_suffix(self, tok: Token) -> Optional[DType]:
        """The dtype of `3:i32`: a `:` and a dtype written right after the literal."""
        colon, name = self.raw(0), self.raw(1)
        if colon.kind == ":" and colon.start == tok.end and name.kind == "ident" and name.start == colon.end:
            self.advance()
            return self.dtype()
        return None

    def literal(self, negative: bool) -> ex.Const:
        tok = self.advance()
        is_float = tok.kind == "ident" or any(c in tok.text for c in ".eE")
        dtype = self.literal_suffix(tok)
        untyped = dtype is None
        if dtype is None:
            if is_float:
                raise self.error(f"float constant {tok.text} needs a dtype, as in {tok.text}:f32", tok)
            dtype = dt.i64
        sign = -1 if negative else 1
        if dtype.is_float:
            value: Union[int, float] = sign * float(tok.text)
        elif dtype.is_int:
            if is_float:
                raise self.error(f"{tok.text} is not an integer but the constant's dtype is {dtype}", tok)
            value = sign * self.int_value(tok)
            if untyped and not -(1 << 63) <= value < (1 << 63):  # it would wrap to another number
                raise self.error(f"integer constant {tok.text} is past the index type (2**63)", tok)
        else:
            raise self.error("bool constants are written true or false", tok)
        return ex.Const(value, ex.ScalarType(dtype))

    def int_value(self, tok: Token) -> int:
        """The value of an integer token; one past 64 bits is an error here, at its place
        (and `int()` of thousands of digits would raise a bare ValueError)."""
        if len(tok.text) > 20 or int(tok.text) >= 1 << 64:
            raise self.error(f"integer constant {tok.text[:24]}{'...' if len(tok.text) > 24 else ''} "
                             "does not fit in 64 bits", tok)
        return int(tok.text)

    def int_literal(self, what: str) -> int:
        tok = self.expect("number", what)
        if not tok.text.isdigit():
            raise self.error(f"expected {what} but found {tok.describe()}", tok)
        return self.int_value(tok)

    def _load(self) -> _Parse:
        tok = self.advance()
        dtype = self.buffer_dtype(tok.text, tok)
        self.expect("[")
        index = tuple((yield self._expr_list("]")))
        lanes = max((i.lanes for i in index), default=1)
        return ex.Load(tok.text, index, ex.ScalarType(dtype, lanes))

    def _call(self) -> _Parse:
        tok = self.advance()
        name = tok.text
        if name in ("cast", "bitcast"):
            self.expect("<")
            dtype = self.dtype()
            lanes: Optional[int] = None
            if name == "bitcast" and self.peek().text == ",":
                self.advance()
                lanes = self.int_literal("a lane count")
            self.expect(">")
            self.expect("(")
            value = yield self._expr()
            self.expect(")")
            node = ex.Cast if name == "cast" else ex.Bitcast
            return node(value, ex.ScalarType(dtype, value.lanes if lanes is None else lanes))
        self.expect("(")
        if name in ("ramp", "broadcast"):
            first = yield self._expr()
            self.expect(",")
            if name == "ramp":
                stride = yield self._expr()
                self.expect(",")
            lanes = self.int_literal("a lane count")
            self.expect(")")
            if name == "ramp":
                return ex.Ramp(first, stride, ex.ScalarType(first.dtype, lanes))
            return ex.Broadcast(first, ex.ScalarType(first.dtype, lanes))
        args = yield self._expr_list(")")
        if name == "select":
            self.check_arity(name, args, 3, tok)
            return ex.Select(args[0], args[1], args[2], args[1].type)
        if name.startswith("vreduce_"):
            self.check_arity(name, args, 1, tok)
            return ex.VectorReduce(name[len("vreduce_"):], args[0], ex.ScalarType(args[0].dtype))
        if name in ex.NAMED_BINARY_OPS:
            self.check_arity(name, args, 2, tok)
            return ex.Binary(name, args[0], args[1], args[0].type)
        if not args:
            raise self.error(f"call to {name}() needs an argument to take its type from", tok)
        t = args[0].type
        rtype = ex.ScalarType(dt.bool_, t.lanes) if name in _PREDICATES else t
        return ex.Call(name, tuple(args), rtype)

    def check_arity(self, name: str, args: list[ex.Expr], n: int, tok: Token) -> None:
        if len(args) != n:
            raise self.error(f"{name} takes {n} argument{'s' if n > 1 else ''}, got {len(args)}", tok)

    # ---- attributes ------------------------------------------------------------------------
    def infix_at(self, offset: int) -> bool:
        """Whether the raw token at `offset` is an infix operator (so an expression goes on)."""
        tok = self.raw(offset)
        if tok.kind == "//":
            nxt = self.raw(offset + 1)
            return nxt.kind != "eof" and nxt.line == tok.line
        return tok.kind in _INFIX

    def attr_value(self) -> object:
        tok = self.peek()
        if tok.kind == "[":
            self.advance()
            return tuple(self.comma_list(self.attr_value, "]"))
        if tok.kind == "string":
            self.advance()
            return self.string(tok)
        if tok.kind == "ident":
            if tok.text == "none":
                self.advance()
                return None
            if tok.text in ("true", "false") and not self.infix_at(1):
                self.advance()
                return tok.text == "true"
            if tok.text in dt.BY_NAME and not self.infix_at(1) and self.raw(1).kind != "(":
                self.advance()
                return dt.BY_NAME[tok.text]
        # A bare number (`4`, `-1`, `1.5`, `-inf`) is a Python number; with a dtype suffix or
        # followed by an operator it is an index expression.
        k = 1 if tok.kind == "-" else 0
        lit = self.raw(k)
        if k == 0 or lit.start == tok.end:
            plain = lit.kind == "number" or (lit.kind == "ident" and lit.text in ("inf", "nan"))
            suffixed = self.raw(k + 1).kind == ":" and self.raw(k + 1).start == lit.end
            if plain and not suffixed and not self.infix_at(k + 1):
                for _ in range(k + 1):
                    self.advance()
                sign = -1 if k else 1
                if lit.kind == "number" and lit.text.isdigit():
                    try:  # attributes hold Python ints of any size, up to int()'s digit limit
                        return sign * int(lit.text)
                    except ValueError:
                        raise self.error(f"integer attribute of {len(lit.text)} digits is too long", lit) from None
                return sign * float(lit.text)
        return self.expr()

    def string(self, tok: Token) -> str:
        try:
            return json.loads(tok.text)
        except json.JSONDecodeError as e:
            raise self.error(f"bad string literal: {e.msg}", tok) from None

    def attr_items(self) -> list[tuple[str, object]]:
        """`{key = value, ...}`."""
        self.expect("{")

        def item() -> tuple[str, object]:
            key = self.ident("an attribute name")
            self.expect("=")
            return key, self.attr_value()

        items = self.comma_list(item, "}")
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise self.error(f"attribute {key!r} given twice")
            seen.add(key)
        return items

    # ---- loop level ------------------------------------------------------------------------
    def _call_arg(self) -> tuple[str, Optional[ex.Expr]]:
        """`%buf` or `%buf offset <bytes>` (a view of the buffer) in a `call`."""
        name = self.expect("value", "a buffer name").text
        return name, (self.expr() if self.accept("ident", "offset") else None)

    def buffer_decl(self) -> lp.Buffer:
        """`%x: f32[s0, 4] strides [4, 1] local`; strides default to row-major."""
        tok = self.expect("value", "a buffer name")
        self.expect(":")
        dtype = self.dtype()
        shape = self.dims()
        strides = self.dims() if self.accept("ident", "strides") else lp.contiguous_strides(shape)
        scope = "global"
        if self.at_keyword("local") or self.at_keyword("global"):
            scope = self.advance().text
        try:
            return lp.Buffer(tok.text, dtype, shape, strides, scope)
        except ValueError as e:
            raise self.error(str(e), tok) from None

    def declare_buffer(self, b: lp.Buffer) -> None:
        self.buf_scopes[-1][b.name] = b.dtype

    def body(self) -> lp.Stmt:
        """`{ stmt* }` as one statement (a `Block` unless it holds exactly one)."""
        tok = self.expect("{")
        self.nesting += 1
        if self.nesting > lp.MAX_NESTING + 1:
            raise self.error(f"statements nest more than {lp.MAX_NESTING} deep (loop.MAX_NESTING)", tok)
        self.push()
        stmts: list[lp.Stmt] = []
        while not self.at("}"):
            if self.at("eof"):
                raise self.error("expected '}' but found end of input")
            stmts.append(self.stmt())
        self.advance()
        self.pop()
        self.nesting -= 1
        return lp.block(*stmts)

    def stmt(self) -> lp.Stmt:
        tok = self.peek()
        if tok.kind == "value":
            return self.store()
        if tok.kind == "ident":
            if tok.text == "let":
                self.advance()
                name = self.ident("a variable name")
                self.expect("=")
                value = self.expr()
                var = ex.Var(name, value.type)
                self.var_scopes[-1][name] = value.type
                return lp.Let(var, value)
            if tok.text == "alloc":
                self.advance()
                b = self.buffer_decl()
                self.declare_buffer(b)
                return lp.Alloc(b)
            if tok.text == "if":
                self.advance()
                cond = self.expr()
                then = self.body()
                orelse = self.body() if self.accept("ident", "else") else None
                return lp.If(cond, then, orelse)
            if tok.text == "for" or (tok.text in lp.LOOP_KINDS and self.raw(1).kind == "ident"
                                     and self.raw(1).text == "for"):
                return self.for_stmt()
        raise self.error(f"expected a statement (let, alloc, if, for or a store) but found {tok.describe()}", tok)

    def store(self) -> lp.Store:
        name = self.advance().text
        self.expect("[")
        index = tuple(self.comma_list(self.expr, "]"))
        self.expect("=")
        return lp.Store(name, index, self.expr())

    def for_stmt(self) -> lp.For:
        kind = "serial"
        if not self.at_keyword("for"):
            kind = self.advance().text
        self.expect_keyword("for")
        name = self.ident("a loop variable")
        self.expect_keyword("in")
        start_tok = self.peek()
        start = self.expr()
        self.expect("..")
        if not self.accept("+") and start != ex.Const(0):
            raise self.error("a range that does not start at 0 is written start..+extent", start_tok)
        extent = self.expr()
        annotations: tuple[tuple[str, object], ...] = ()
        if self.accept("ident", "attrs"):
            annotations = tuple(self.attr_items())
        self.push()
        self.var_scopes[-1][name] = ex.INDEX
        body = self.body()
        self.pop()
        return lp.For(ex.Var(name, ex.INDEX), start, extent, kind, body, annotations)  # type: ignore[arg-type]

    def symbols(self) -> tuple[ex.Var, ...]:
        if not self.accept("ident", "symbols"):
            return ()
        self.expect("(")
        return tuple(ex.Var(n, ex.INDEX) for n in self.comma_list(lambda: self.ident("a symbol"), ")"))

    def kernel(self) -> lp.Kernel:
        self.expect_keyword("kernel")
        name = self.expect("func", "a kernel name (@name)").text
        self.expect("(")
        self.push()
        params = tuple(self.comma_list(self.buffer_decl, ")"))
        for p in params:
            self.declare_buffer(p)
        symbols = self.symbols()
        attrs: tuple[tuple[str, object], ...] = ()
        if self.accept("ident", "attrs"):
            attrs = tuple(self.attr_items())
        body = self.body()
        self.pop()
        return lp.Kernel(name, params, symbols, body, attrs)  # type: ignore[arg-type]

    def program(self) -> lp.Program:
        self.expect_keyword("program")
        name = self.expect("func", "a program name (@name)").text
        self.expect("(")
        inputs = tuple(self.comma_list(self.buffer_decl, ")"))
        self.expect("->")
        self.expect("(")
        outputs = tuple(self.comma_list(self.buffer_decl, ")"))
        symbols = self.symbols()
        self.expect("{")
        temps: list[lp.Buffer] = []
        offsets: list[tuple[str, ex.Expr]] = []
        workspace: ex.Expr = ex.Const(0)
        calls: list[lp.KernelCall] = []
        results: tuple[str, ...] = ()
        result_views: tuple[tuple[int, tuple[ex.Expr, ...]], ...] = ()
        constant_inputs: tuple[str, ...] = ()
        kept: tuple[str, ...] = ()
        kept_from: tuple[str, ...] = ()
        while not self.accept("}"):
            tok = self.peek()
            if self.at_keyword("return"):
                self.advance()
                returned = self.comma_list(self._returned, "}")
                results = tuple(name for name, _ in returned)
                result_views = tuple((k, shape) for k, (_, shape) in enumerate(returned) if shape is not None)
                break
            if self.accept("ident", "temp"):
                t = self.buffer_decl()
                temps.append(t)
                if self.accept("ident", "offset"):
                    offsets.append((t.name, self.expr()))
            elif self.accept("ident", "workspace"):
                workspace = self.expr()
            elif self.accept("ident", "constant"):
                constant_inputs = self.value_names("an input (%name)")
            elif self.accept("ident", "kept"):
                kept = self.value_names("a temporary (%name)")
                self.expect_keyword("from")
                kept_from = self.value_names("an input (%name)")
            elif self.accept("ident", "call"):
                kernel = self.expect("func", "a kernel name (@name)").text
                self.expect("(")
                pairs = self.comma_list(self._call_arg, ")")
                views = tuple(off for _, off in pairs)
                calls.append(lp.KernelCall(kernel, tuple(a for a, _ in pairs),
                                           views if any(off is not None for off in views) else ()))
            else:
                raise self.error(f"expected 'temp', 'workspace', 'constant', 'kept', 'call' or '}}' but found "
                                 f"{tok.describe()}", tok)
        kernels: list[lp.Kernel] = []
        while self.at_keyword("kernel"):
            kernels.append(self.kernel())
        return lp.Program(name, inputs, outputs, tuple(temps), symbols, tuple(calls), tuple(kernels),
                          tuple(offsets), workspace, results, result_views, constant_inputs, kept, kept_from)

    def _returned(self) -> tuple[str, Optional[tuple[ex.Expr, ...]]]:
        """One entry of a program's `return` line: `%name`, or `%name as [d0, d1, ...]`."""
        name = self.expect("value", "a buffer name").text
        if not self.accept("ident", "as"):
            return name, None
        return name, self.dims()

    # ---- tensor level ----------------------------------------------------------------------
    def value_ref(self) -> Value:
        tok = self.expect("value", "a value (%name)")
        v = self.values.get(tok.text)
        if v is None:
            raise self.error(f"use of undefined value %{tok.text}", tok)
        return v

    def define_value(self, v: Value, tok: Token) -> None:
        if v.name in self.values:
            raise self.error(f"value %{v.name} is defined twice", tok)
        self.values[v.name] = v

    def graph_input(self) -> Union[Value, ex.Var]:
        tok = self.peek()
        if tok.kind == "ident":
            self.advance()
            return ex.Var(tok.text, ex.INDEX)
        tok = self.expect("value", "an input (%name: type, or a symbol)")
        self.expect(":")
        t = self.tensor_type()
        strides = self.dims() if self.accept("ident", "strides") else None
        if strides is not None and len(strides) != t.rank:
            raise self.error(f"input %{tok.text}: {t.rank} dims but {len(strides)} strides", tok)
        v = Value(tok.text, t, strides, constant=self.accept("ident", "const"))
        self.define_value(v, tok)
        return v

    def graph(self) -> Graph:
        self.expect_keyword("graph")
        name = self.expect("func", "a graph name (@name)").text
        self.values = {}
        self.expect("(")
        g = Graph(name, self.comma_list(self.graph_input, ")"))
        self.expect("{")
        while not self.at_keyword("return"):
            g.ops.append(self.op())
        self.advance()
        if not self.at("}"):
            g.outputs.append(self.value_ref())
            while self.accept(","):
                g.outputs.append(self.value_ref())
        self.expect("}")
        return g

    def op(self) -> Op:
        result_toks: list[Token] = []
        if not self.at("="):
            result_toks.append(self.expect("value", "an op result (%name) or 'return'"))
            while self.accept(","):
                result_toks.append(self.expect("value", "a result name"))
        self.expect("=")
        name_tok = self.peek()
        name = self.ident("an op name")
        self.expect("(")
        operands = self.comma_list(self.value_ref, ")")
        attrs = dict(self.attr_items()) if self.at("{") else {}
        self.expect(":")
        types = [self.tensor_type()] if result_toks else []
        while result_toks and self.accept(","):
            types.append(self.tensor_type())
        if len(types) != len(result_toks):
            raise self.error(f"op {name}: {len(result_toks)} results but {len(types)} result types", name_tok)
        loc = None
        if self.accept("ident", "loc"):
            self.expect("(")
            loc = self.string(self.expect("string", "a location string"))
            self.expect(")")
        op = Op(name, operands, attrs, [], loc)
        for tok, t in zip(result_toks, types):
            v = Value(tok.text, t, producer=op)
            self.define_value(v, tok)
            op.results.append(v)
        return op

    # ---- top level -------------------------------------------------------------------------
    def items(self) -> list[IR]:
        out: list[IR] = []
        while not self.at("eof"):
            tok = self.peek()
            if tok.kind == "ident" and tok.text == "graph":
                out.append(self.graph())
            elif tok.kind == "ident" and tok.text == "kernel":
                out.append(self.kernel())
            elif tok.kind == "ident" and tok.text == "program":
                out.append(self.program())
            else:
                raise self.error(f"expected 'graph', 'kernel' or 'program' but found {tok.describe()}", tok)
        return out


def _binary_type(op: str, a: ex.Expr) -> ex.ScalarType:
    return ex.ScalarType(dt.bool_, a.lanes) if op in ex.COMPARISONS else a.type


# --------------------------------------------------------------------------------------------
# Public API

def parse_all(text: str, filename: str = "<string>") -> list[IR]:
    """Every top-level item (graph, kernel, program with its kernels), in text order."""
    return _Parser(text, filename).items()


def parse(text: str, filename: str = "<string>") -> Union[IR, list[IR]]:
    """The item the text holds, or a list when it holds several (see `parse_all`)."""
    p = _Parser(text, filename)
    items = p.items()
    if not items:
        raise p.error("expected 'graph', 'kernel' or 'program' but found end of input")
    return items[0] if len(items) == 1 else items


def _parse_one(text: str, filename: str, kind: str) -> IR:
    p = _Parser(text, filename)
    tok = p.peek()
    if not (tok.kind == "ident" and tok.text == kind):
        raise p.error(f"expected '{kind}' but found {tok.describe()}", tok)
    item = getattr(p, kind)()
    p.expect_end()
    return item


def parse_graph(text: str, filename: str = "<string>") -> Graph:
    """Exactly one tensor-level `graph`."""
    return _parse_one(text, filename, "graph")  # type: ignore[return-value]


def parse_kernel(text: str, filename: str = "<string>") -> lp.Kernel:
    """Exactly one `kernel`."""
    return _parse_one(text, filename, "kernel")  # type: ignore[return-value]


def parse_program(text: str, filename: str = "<string>") -> lp.Program:
    """Exactly one `program`, with the kernel definitions that follow it."""
    return _parse_one(text, filename, "program")  # type: ignore[return-value]


def _with_env(p: _Parser, var_types: Optional[Mapping[str, ex.ScalarType]],
              buffers: Optional[Mapping[str, Union[DType, lp.Buffer]]]) -> None:
    p.var_scopes[0].update(var_types or {})
    for name, b in (buffers or {}).items():
        p.buf_scopes[0][name] = b.dtype if isinstance(b, lp.Buffer) else b


def parse_expr(text: str, var_types: Optional[Mapping[str, ex.ScalarType]] = None,
               buffers: Optional[Mapping[str, Union[DType, lp.Buffer]]] = None,
               filename: str = "<string>") -> ex.Expr:
    """One expression. Variables not in `var_types` are i64; loads need their buffer (or its
    dtype) in `buffers`."""
    p = _Parser(text, filename)
    _with_env(p, var_types, buffers)
    e = p.expr()
    p.expect_end()
    return e


def parse_stmt(text: str, var_types: Optional[Mapping[str, ex.ScalarType]] = None,
               buffers: Optional[Mapping[str, Union[DType, lp.Buffer]]] = None,
               filename: str = "<string>") -> lp.Stmt:
    """Loop statements as `print_stmt` writes them (one statement, or a `Block` of several)."""
    p = _Parser(text, filename)
    _with_env(p, var_types, buffers)
    stmts: list[lp.Stmt] = []
    while not p.at("eof"):
        stmts.append(p.stmt())
    return lp.block(*stmts)
