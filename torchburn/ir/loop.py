"""The loop-nest IR: kernels made of buffers, loops, loads, stores and local allocations.

In the spirit of Halide's statement IR and TVM's TensorIR. A `Kernel` is one loop nest over
buffers; a `Program` is the whole compiled graph: its inputs, outputs and workspace
temporaries, and the kernels called in order. Codegen turns a program into one native module
with one entry function.

Text form:

    program @main(%x: f32[s0, 4] strides [4, 1]) -> (%out: f32[s0, 4] strides [4, 1]) {
      call @k0(%x, %out)
    }
    kernel @k0(%x: f32[s0, 4] strides [4, 1], %out: f32[s0, 4] strides [4, 1]) {
      parallel for i0 in 0..s0 {
        for i1 in 0..4 {
          %out[i0, i1] = exp(%x[i0, i1])
        }
      }
    }

Statements are immutable dataclasses, like expressions; passes rebuild what they change.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator, Optional

from .dtypes import DType
from .expr import Expr, Var

#: Loop kinds. `vectorized` and `unrolled` are requests that passes carry out.
LOOP_KINDS: tuple[str, ...] = ("serial", "parallel", "vectorized", "unrolled")
#: The annotation (`{loop = "keep-rolled"}`) of a serial loop its author wants kept as one
#: scalar loop: `vectorize` does not choose it and `unroll` does not unroll it on its own
#: initiative (loops inside it are still theirs to take). A GEMM's transposing pack is one:
#: vectorized it would gather, and unrolled it would be 64 copies for every later stage.
KEEP_ROLLED: tuple[str, str] = ("loop", "keep-rolled")
#: Where a buffer lives: kernel parameter / program buffer (`global`) or in a kernel's frame.
SCOPES: tuple[str, ...] = ("global", "local")


@dataclass(frozen=True)
class Buffer:
    """A strided n-d array: element dtype, shape and strides (in elements), both symbolic.

    Text: `%x: f32[s0, 4] strides [4, 1]`, local ones `alloc %acc: f32[1] local`.
    """

    name: str
    dtype: DType
    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]
    scope: str = "global"

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.strides):
            raise ValueError(f"buffer %{self.name}: {len(self.shape)} dims but {len(self.strides)} strides")
        if self.scope not in SCOPES:
            raise ValueError(f"buffer %{self.name}: unknown scope {self.scope!r}")

    @property
    def ndim(self) -> int:
        return len(self.shape)


class Stmt:
    """Base of all statements."""

    def children(self) -> tuple["Stmt", ...]:
        return ()


@dataclass(frozen=True)
class Store(Stmt):
    """Write `value` to `buffer[index...]`. Text: `%out[i, j] = expr`."""

    buffer: str
    index: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True)
class Let(Stmt):
    """Bind a scalar name for the rest of the enclosing block. Text: `let t0 = expr`."""

    var: Var
    value: Expr


@dataclass(frozen=True)
class Alloc(Stmt):
    """A local buffer for the rest of the enclosing block (registers or stack).

    Text: `alloc %acc: f32[4] local`.
    """

    buffer: Buffer


@dataclass(frozen=True)
class Block(Stmt):
    """Statements run in order."""

    stmts: tuple[Stmt, ...]

    def children(self) -> tuple[Stmt, ...]:
        return self.stmts


@dataclass(frozen=True)
class For(Stmt):
    """`for var in start..start+extent` with a kind (serial, parallel, vectorized, unrolled).

    `annotations` carry provenance and hints, for example `{origin = "aten.add.Tensor"}`;
    `{loop = "keep-rolled"}` (`KEEP_ROLLED`) keeps a serial loop from `vectorize` and from
    `unroll`'s own choices. Text: `parallel for i0 in 0..s0 {origin = "aten.mm"} { ... }`.
    """

    var: Var
    start: Expr
    extent: Expr
    kind: str
    body: Stmt
    annotations: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in LOOP_KINDS:
            raise ValueError(f"unknown loop kind {self.kind!r}; expected one of {LOOP_KINDS}")

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)

    def annotation(self, key: str) -> Optional[str]:
        return dict(self.annotations).get(key)


@dataclass(frozen=True)
class If(Stmt):
    """Run `then` when `cond` holds, else `orelse` (which may be None)."""

    cond: Expr
    then: Stmt
    orelse: Optional[Stmt] = None

    def children(self) -> tuple[Stmt, ...]:
        return (self.then,) if self.orelse is None else (self.then, self.orelse)


#: A kernel attribute: the loop iterations one GPU invocation may run, an index expression over
#: the symbols, where `gpu-chunk-serial` could not bring them within the device's limit (code
#: generation refuses a constant past it; the launcher checks the others per call).
ITERATIONS_ATTR = "gpu_iterations"


@dataclass(frozen=True)
class Kernel:
    """One loop nest over parameter buffers; symbols (sizes, strides) are passed by value.

    `attrs` record where the kernel came from (`origin`: the ATen ops it computes) and
    hints for code generation: `fastmath = "contract"` (fused multiply-adds), `prefetch =
    "w:2048"` (each vector load of %w also prefetches 2048 bytes further on, clamped to %w:
    a weight streamed once, as the quantized GEMV kernels read theirs):

        kernel @k0(%x: f32[1, 2048] ..., %w: u8[8192, 1680] ...) attrs {prefetch = "w:2048"} {
          ... %w[n, ramp(b * 210, 1, 32)] ...   -> LLVM: llvm.prefetch(&w[min(o + 2048, last)]); load
    """

    name: str
    params: tuple[Buffer, ...]
    symbols: tuple[Var, ...]
    body: Stmt
    attrs: tuple[tuple[str, str], ...] = ()

    def param(self, name: str) -> Buffer:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"kernel @{self.name} has no parameter %{name}")


@dataclass(frozen=True)
class KernelCall:
    """`call @kernel(%a, %b)` in a program: program buffers bound to the kernel's parameters.

    An argument may be a view of its buffer at a byte offset (`call @k(%cache offset 4096,
    %t)`): the parameter then starts that many bytes into the buffer and has the layout the
    kernel declares for it (a slice of a layer's keys in a stacked KV cache, so every layer
    calls one kernel). `offsets` is empty, or holds one entry per argument: None for the
    buffer itself, else the offset (an index expression in the program's symbols)."""

    kernel: str
    args: tuple[str, ...]
    offsets: tuple[Optional[Expr], ...] = ()

    def offset(self, i: int) -> Optional[Expr]:
        """The byte offset of argument `i`'s view (None: the buffer itself)."""
        return self.offsets[i] if self.offsets else None


#: The program symbol that says the kept temporaries must be computed again (`Program.kept`).
REFRESH = "refresh"


@dataclass(frozen=True)
class Program:
    """A compiled graph: inputs and outputs (caller's memory), temporaries (workspace), and the
    kernels called in order. Symbols are bound from the inputs' sizes and strides, or passed as
    scalar inputs (`symbol_inputs`), in the order of `symbols`. A final `return` line says
    what the graph returns when it is not just `outputs` in order (see `results`), and which
    results are an output buffer viewed in another shape, `return %out0 as [64, 32, 3, 3]`
    (see `result_views`). A `constant %w` line names the inputs the caller keeps unchanged
    between calls, a `kept %t from %w` line the temporaries whose values outlive a call
    (`constant_inputs`, `kept`, `kept_from`; `keep-constant-prep`):

        program @f(%x: f16[] strides []) -> () {
          return %x
        }
    """

    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    temps: tuple[Buffer, ...]
    symbols: tuple[Var, ...]
    calls: tuple[KernelCall, ...]
    kernels: tuple[Kernel, ...]
    #: Byte offset of each temporary inside the workspace (set by memory planning) and the
    #: workspace's total size in bytes; both are index expressions in the symbols.
    temp_offsets: tuple[tuple[str, Expr], ...] = field(default=())
    workspace_bytes: Expr = field(default_factory=lambda: _zero())
    #: What the compiled graph returns, in its order: the name of an output buffer or of an
    #: input buffer returned as is (printed `return %x, ...`). Empty means `outputs`, each once,
    #: in order. The launcher reads it, not the graph: the tensor passes may have turned a
    #: computed output into an input (`cast(cast(x))` -> `x`) or merged two, and a graph that
    #: hits the compile cache never went through them.
    results: tuple[str, ...] = field(default=())
    #: Results returned as a reshaped view of their buffer, by position in `results`: a
    #: graph output that is a reshape of a value computed by a kernel is that kernel's output
    #: buffer (contiguous, in the value's shape), returned viewed in the output's shape, with no
    #: kernel copying it (printed `return %out0 as [64, 32, 3, 3]`; `lower-to-loops`):
    #:
    #:     %0 = matmul(%a, %b) {kernel = 0} : f32[64, 288]
    #:     %1 = reshape(%0) {shape = [64, 32, 3, 3], kernel = 1} : f32[64, 32, 3, 3]
    #:     return %1
    #:
    #: lowers to `call @k0(%b, %a, %out0)` into `%out0: f32[64, 288]` and
    #: `return %out0 as [64, 32, 3, 3]`, where it was a GEMM into a temporary and a copy kernel.
    result_views: tuple[tuple[int, tuple[Expr, ...]], ...] = field(default=())
    #: Inputs the caller keeps unchanged between calls unless the tensor, its memory or its
    #: version counter changes (graph inputs marked `const`: parameters and buffers in
    #: inference), printed `constant %w0, %w1`.
    constant_inputs: tuple[str, ...] = field(default=())
    #: Temporaries whose values outlive the call (`keep-constant-prep`), printed
    #: `kept %k0_ws0 from %w0`: each is written only by statements run under `if refresh != 0`
    #: that read nothing but the `kept_from` inputs (all constant) and other kept temporaries.
    #: The caller passes the symbol `refresh` (`REFRESH`) as 1 on the first call and whenever a
    #: `kept_from` input, or the workspace, is not the one of the last call, else 0. Memory
    #: planning places them first in the workspace and never reuses their bytes.
    kept: tuple[str, ...] = field(default=())
    kept_from: tuple[str, ...] = field(default=())

    def result_view(self, k: int) -> Optional[tuple[Expr, ...]]:
        """The shape result `k` is returned viewed in, or None (the buffer as it is)."""
        for pos, shape in self.result_views:
            if pos == k:
                return shape
        return None

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(f"program @{self.name} has no kernel @{name}")

    def buffer(self, name: str) -> Buffer:
        for b in (*self.inputs, *self.outputs, *self.temps):
            if b.name == name:
                return b
        raise KeyError(f"program @{self.name} has no buffer %{name}")

    def temp_offset(self, name: str) -> Expr:
        for n, off in self.temp_offsets:
            if n == name:
                return off
        raise KeyError(f"program @{self.name}: temporary %{name} has no workspace offset")

    def result_names(self) -> tuple[str, ...]:
        """The buffer returned at each position of the graph's outputs (see `results`)."""
        return self.results or tuple(b.name for b in self.outputs)

    def with_kernels(self, kernels: tuple[Kernel, ...]) -> "Program":
        return replace(self, kernels=kernels)


def written_inputs(p: "Program") -> set[str]:
    """Names of the input buffers a kernel of `p` stores into (an in-place write, see
    `lower-to-loops`); the program returns such an input as itself, never a copy. A kernel
    takes the buffer it writes as its last parameter, so the calls alone tell (a program read
    back from the cache without its kernels' bodies answers the same)."""
    inputs = {b.name for b in p.inputs}
    return {c.args[-1] for c in p.calls if c.args and c.args[-1] in inputs}


def _zero() -> Expr:
    from .expr import Const

    return Const(0)


def block(*stmts: Stmt) -> Stmt:
    """A block of statements with nested blocks flattened; one statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Block):
            flat.extend(s.stmts)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Block(tuple(flat))


def walk_stmts(s: Stmt) -> Iterator[Stmt]:
    """Every statement, parents before children."""
    stack = [s]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children()))


def stmt_exprs(s: Stmt) -> tuple[Expr, ...]:
    """The expressions a statement holds directly (not those of nested statements)."""
    if isinstance(s, Store):
        return (*s.index, s.value)
    if isinstance(s, Let):
        return (s.value,)
    if isinstance(s, For):
        return (s.start, s.extent)
    if isinstance(s, If):
        return (s.cond,)
    if isinstance(s, Alloc):
        return (*s.buffer.shape, *s.buffer.strides)
    return ()


#: How deep statements may nest (loops, ifs and blocks inside each other). The printer,
#: verifier, statement passes and code generators walk statements recursively, a few Python
#: frames per level; this bound keeps them well inside Python's recursion limit even when
#: called deep inside torch.compile. Generated kernels nest a few levels per tensor dimension
#: (tens at most); the parser and the verifier refuse anything deeper, with a location.
MAX_NESTING = 100


def nesting_depth(s: Stmt) -> int:
    """How many loops, ifs and blocks enclose the innermost statement of `s` (iterative)."""
    deepest = 0
    stack = [(s, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if isinstance(node, Block):
            stack.extend((c, depth + 1) for c in node.stmts)
        elif isinstance(node, For):
            stack.append((node.body, depth + 1))
        elif isinstance(node, If):
            stack.append((node.then, depth + 1))
            if node.orelse is not None:
                stack.append((node.orelse, depth + 1))
    return deepest


#: Integer operations that divide: undefined for a divisor of 0 (`semantics.DivisionByZero`).
DIVIDING_OPS: frozenset[str] = frozenset({"div", "floordiv", "mod", "remainder", "fmod"})


def integer_divisors(s: Stmt) -> Iterator[Expr]:
    """The divisor of every integer division or remainder (infix or call) under `s`, for
    codegen and launchers that must handle a divisor of 0."""
    from .expr import Binary, Call, walk

    for st in walk_stmts(s):
        for e in stmt_exprs(st):
            for node in walk(e):
                if isinstance(node, Binary) and node.op in DIVIDING_OPS and node.dtype.is_int:
                    yield node.b
                elif isinstance(node, Call) and node.name in DIVIDING_OPS and len(node.args) == 2 \
                        and node.args[0].dtype.is_int:
                    yield node.args[1]


def checks_indices(s: Stmt) -> bool:
    """Whether an index under `s` is checked (`checked_index`): such a kernel can fault."""
    from .expr import Call, walk
    from .opnames import CHECKED_INDEX

    return any(isinstance(node, Call) and node.name == CHECKED_INDEX
               for st in walk_stmts(s) for e in stmt_exprs(st) for node in walk(e))


def contiguous_strides(shape: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """Row-major strides for a shape (symbolic shapes give symbolic strides)."""
    from .expr import Const, mul

    strides: list[Expr] = []
    acc: Expr = Const(1)
    for d in reversed(shape):
        strides.append(acc)
        acc = mul(acc, d)
    return tuple(reversed(strides))
