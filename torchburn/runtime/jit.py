"""From LLVM IR text to callable native code, and the OpenMP runtime it runs on.

    obj = compile_llvm_ir(llvm_ir, target)      # O2 (new pass manager) + object emission
    native = load_object(obj)                   # MCJIT engine holding the object, kept alive
    entry = native.entry("torchburn_main")      # ctypes: void(ptr buffers, ptr symbols, ptr ws)

Compilation and loading are separate so the object code (`ObjectCode.data`) can be cached on
disk and loaded in another process without compiling again. Every engine is created after
libgomp is loaded into the process with `load_library_permanently`, so generated code that
calls `GOMP_parallel` resolves it to the same OpenMP runtime torch uses (torch ships one in
`torch/lib`), sharing its thread pool. libm symbols (`erff`, `expm1f`, ...) resolve from the
process the same way. A program emitted a module per kernel is compiled by `ModuleParts`, LLVM
working in a second thread while Python emits the next module; `load_object` refuses an
object calling a function the process lacks (the code generator's own helper calls included).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional, Union

import llvmlite.binding as llvm

from . import faults, threads
from .shared_lib import (ENTRY_FUNCTYPE, ObjectCode, check_tile_state, elf_symbols, find_libgomp,  # noqa: F401  (re-exported)
                         load_shared, undefined_symbols)

if TYPE_CHECKING:  # the target is data; loading cached code never imports the IR
    from ..codegen.target import Target

_lock = threading.Lock()
log = logging.getLogger("torchburn")

#: LLVM's optimization level for generated code (the new pass manager's pipeline and the
#: code generator's), except register-blocked products (`MICRO_KERNEL_OPT_LEVEL`). O2: O3's
#: extra work (more full unrolling, more instcombine rounds) bought no speed on the CPU
#: table's elementwise, normalization and attention rows and cost a third more LLVM time
#: (`bench_compile.py --opt-levels 2,3`, `docs/benchmarks.md`). At O2 a bf16 `select` once
#: reached the code generator, which widens it to f32 and calls compiler-rt's `__truncsfbf2`,
#: absent from the process; codegen now selects 16-bit floats as integers
#: (`halfconv.select_bits`), every module with `bfloat` values defines that helper
#: (`module._BF16_RUNTIME`), and `load_object` refuses any call it cannot bind.
OPT_LEVEL = 2
#: The level of a module holding a register-blocked product (a part marked `MICRO_KERNEL_MARK`
#: by `codegen.llvm.module.emit_program_parts`): O3 unrolls the GEMM and quantized-GEMM loops
#: once more, and one-thread prefill of SmolLM2 (pp128, int8 qlinear kernels) measured 8-12%
#: slower at O2 (medians of 7 and 15 interleaved rounds at load 8-10); these kernels keep O3.
MICRO_KERNEL_OPT_LEVEL = 3
#: How `emit_program_parts` marks such a module (its first line; a comment to LLVM).
MICRO_KERNEL_MARK = "; torchburn: micro-kernel\n"


class JITError(RuntimeError):
    """Native code could not be compiled or loaded."""


# ---- LLVM and OpenMP set-up (once per process) ------------------------------------------------

@functools.lru_cache(maxsize=1)
def _init_llvm() -> None:
    """Initialize LLVM's native target, and make the C and math libraries' symbols visible to
    the JIT's resolver (Python loads them privately, so `erff` or `memset` would not be found)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    # libgcc_s: the compiler runtime functions LLVM's code generator may call where the CPU
    # lacks an instruction (`__truncdfhf2`, `__extendhfsf2` without F16C; GCC 12 and later)
    for lib, soname in (("m", "libm.so.6"), ("c", "libc.so.6"), ("gcc_s", "libgcc_s.so.1")):
        try:  # the usual soname first: find_library spawns `ldconfig -p`, slow on a warm start
            llvm.load_library_permanently(soname)
            continue
        except RuntimeError:
            pass
        path = ctypes.util.find_library(lib)
        if path is not None:
            try:
                llvm.load_library_permanently(path)
            except RuntimeError:
                pass


@functools.lru_cache(maxsize=1)
def _libgomp() -> Optional[ctypes.CDLL]:
    """Load libgomp into the process for the JIT's symbol resolution; None if there is none."""
    path = find_libgomp()
    if path is None:
        return None
    llvm.load_library_permanently(path)
    return ctypes.CDLL(path)


def _openmp(required: bool) -> Optional[ctypes.CDLL]:
    lib = _libgomp()
    if lib is None and required:
        raise JITError("this program has parallel loops but no OpenMP runtime (libgomp) was "
                       "found: torch/lib has none and ctypes.util.find_library('gomp') failed")
    return lib


def set_num_threads(n: int) -> None:
    """Threads for parallel loops (libgomp's `omp_set_num_threads`; torch shares the setting)."""
    if n < 1:
        raise ValueError(f"number of threads must be at least 1, got {n}")
    lib = _openmp(required=True)
    assert lib is not None
    lib.omp_set_num_threads(ctypes.c_int(n))


def get_num_threads() -> int:
    """The number of threads a parallel loop will use (`omp_get_max_threads`)."""
    lib = _openmp(required=False)
    return 1 if lib is None else int(lib.omp_get_max_threads())


@functools.lru_cache(maxsize=1)
def _init_all_targets() -> None:
    """Every target LLVM was built with: code for another CPU (`TORCHBURN_TARGET=neon` on an
    x86 machine) is compiled to object code and assembly, never run."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()


def _llvm_target(target: "Target") -> llvm.Target:
    _init_llvm()
    if target.triple.split("-", 1)[0] != llvm.get_process_triple().split("-", 1)[0]:
        _init_all_targets()
    return llvm.Target.from_triple(target.triple)


def _target_machine(target: Target, opt_level: int) -> llvm.TargetMachine:
    """A fresh target machine (an MCJIT engine takes ownership of the one it is given)."""
    return _llvm_target(target).create_target_machine(
        cpu=target.cpu, features=target.features, opt=opt_level, reloc="default", codemodel="jitdefault")


@functools.lru_cache(maxsize=8)
def _cached_target_machine(target: Target, opt_level: int) -> llvm.TargetMachine:
    return _target_machine(target, opt_level)


# ---- compile ---------------------------------------------------------------------------------

#: Separates the modules of a program emitted in parts (`codegen.llvm.module.emit_program_parts`)
#: where they travel as one text (`Build.llvm_ir`, dumps, `assembly`): each is parsed and
#: optimized on its own, then they are linked into one module.
MODULE_SEPARATOR = "\n; ---- torchburn: next module ----\n"


def join_modules(parts: "list[str] | tuple[str, ...]") -> str:
    """Module texts as one text (`MODULE_SEPARATOR`); `compile_llvm_ir` and `assembly` take it."""
    return MODULE_SEPARATOR.join(parts)


def part_opt_level(llvm_ir: str, opt_level: int) -> int:
    """The level one module is optimized at: `MICRO_KERNEL_OPT_LEVEL` for a marked
    register-blocked product (unless optimization is off), else `opt_level`."""
    if opt_level > 0 and llvm_ir.startswith(MICRO_KERNEL_MARK):
        return max(opt_level, MICRO_KERNEL_OPT_LEVEL)
    return opt_level


# Each call into LLVM from LLVM's thread (`ModuleParts`) returns into Python by taking the GIL
# back from the caller's thread, busy with the passes and codegen: a wait of up to the switch
# interval (5 ms) per call. What does not change between modules is made once.
@functools.lru_cache(maxsize=8)
def _data_layout(target: Target, opt_level: int) -> str:
    return str(_cached_target_machine(target, opt_level).target_data)


@functools.lru_cache(maxsize=4)
def _tuning_options(opt_level: int) -> Any:
    """The new pass manager's options at `opt_level` (the pass builder copies them)."""
    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    # Our `vectorize` pass already wrote the SIMD code: LLVM's loop and SLP vectorizers
    # found nothing to add on the CPU benchmark table and cost a fifth of LLVM's time.
    pto.loop_vectorization = False
    pto.slp_vectorization = False
    return pto


def _optimize_one(llvm_ir: str, target: Target, opt_level: int, phases: Optional[dict[str, float]]) -> llvm.ModuleRef:
    """One module parsed, verified and optimized (the caller holds `_lock`)."""
    opt_level = part_opt_level(llvm_ir, opt_level)
    tm = _cached_target_machine(target, opt_level)
    t0 = time.thread_time()
    try:
        mod = llvm.parse_assembly(llvm_ir)
        mod.verify()
    except RuntimeError as e:
        raise JITError(f"LLVM rejected the generated IR: {e}") from e
    t1 = time.thread_time()
    mod.triple = target.triple
    mod.data_layout = _data_layout(target, opt_level)
    if opt_level > 0:
        pb = llvm.create_pass_builder(tm, _tuning_options(opt_level))
        pb.getModulePassManager().run(mod, pb)
    if phases is not None:
        phases["llvm_parse"] = phases.get("llvm_parse", 0.0) + t1 - t0
        phases["llvm_optimize"] = phases.get("llvm_optimize", 0.0) + time.thread_time() - t1
    return mod


def _linked(modules: list[llvm.ModuleRef]) -> llvm.ModuleRef:
    """The modules linked into the first (kernels the entry declares become its definitions)."""
    first = modules[0]
    for other in modules[1:]:
        try:
            first.link_in(other)
        except RuntimeError as e:
            raise JITError(f"LLVM could not link the program's modules: {e}") from e
    return first


def _optimized_module(llvm_ir: str, target: Target, opt_level: int,
                      phases: Optional[dict[str, float]] = None) -> tuple[llvm.ModuleRef, llvm.TargetMachine]:
    texts = llvm_ir.split(MODULE_SEPARATOR)
    mods = [_optimize_one(text, target, opt_level, phases) for text in texts]
    return _linked(mods), _cached_target_machine(target, _emit_level(texts, opt_level))


def _emit_level(texts: "list[str]", opt_level: int) -> int:
    """The code generator's level for the linked module: the highest of its parts'."""
    return max(part_opt_level(t, opt_level) for t in texts)


def _emit(mod: llvm.ModuleRef, target: Target, opt_level: int, shared: bool,
          phases: Optional[dict[str, float]]) -> ObjectCode:
    """The object code of an optimized module (the caller holds `_lock`), and with `shared` its
    shared library (see `compile_llvm_ir`)."""
    _check_external_symbols(mod)
    pic = shared and _linker() is not None
    t0 = time.thread_time()
    tm = _pic_target_machine(target, opt_level) if pic else _cached_target_machine(target, opt_level)
    data = bytes(tm.emit_object(mod))
    t1, w1 = time.thread_time(), time.perf_counter()
    shared_lib = _link_shared([data]) if pic else b""
    if pic and not shared_lib:  # MCJIT will load it: not the small code model's PIC (`load_native`)
        data = bytes(_cached_target_machine(target, opt_level).emit_object(mod))
    if phases is not None:
        phases["llvm_emit"] = phases.get("llvm_emit", 0.0) + t1 - t0
        phases["llvm_link"] = phases.get("llvm_link", 0.0) + time.perf_counter() - w1
    return ObjectCode(data, target.triple, target.cpu, target.features, shared_lib)


def compile_llvm_ir(llvm_ir: str, target: Target, opt_level: int = OPT_LEVEL, shared: bool = False,
                    phases: Optional[dict[str, float]] = None) -> ObjectCode:
    """Optimize LLVM IR text with the new pass manager's O`opt_level` pipeline and emit an
    object file for `target`. The text may hold several modules (`join_modules`), each
    optimized on its own, then linked. With `shared`, the object is position independent and
    is also linked into a shared library, which a later process loads without LLVM
    (`shared_lib.load_shared`); left empty when there is no linker or linking fails. One
    emission serves both: this process loads the same PIC object through LLVM. `phases`, if
    given, gets this thread's CPU seconds added per stage (`llvm_parse`: parse and verify,
    `llvm_optimize`, `llvm_emit`: instruction selection to object code; `llvm_link`: wall
    seconds of the linker, a child process), for `benchmarks/bench_compile.py`."""
    with _lock:  # LLVM target machines are not safe to share across threads
        mod, _ = _optimized_module(llvm_ir, target, opt_level, phases)
        return _emit(mod, target, _emit_level(llvm_ir.split(MODULE_SEPARATOR), opt_level), shared, phases)


#: The stack of LLVM's worker thread (`ModuleParts`).
LLVM_THREAD_STACK = 16 << 20
_stack_size_lock = threading.Lock()


class ModuleParts:
    """LLVM's work on a program emitted in parts, in a second thread while the caller emits
    the next part (`codegen.llvm.module.emit_program_parts`):

        parts = ModuleParts(target, shared=True)
        try:
            for text in emit_program_parts(program, target):
                parts.add(text)            # parsed and optimized in the background
            obj = parts.finish()           # the parts' object code (and its shared library)
        finally:
            parts.close()

    Code generation is Python (holding the GIL); llvmlite's calls into LLVM release it, so on
    two cores LLVM optimizes kernel k while Python emits kernel k + 1. llvmlite serializes
    every call into LLVM, and `llvmlite.ir` calls none, so the caller's thread and the worker
    never use LLVM at once; the worker holds `_lock` for each part as every other compile does.

    **Object code as the worker finds time.** After optimizing a part, the worker emits its
    object file right away when no other part is waiting (it would otherwise sit idle until
    the caller's passes and codegen hand it the next); parts that found other parts queued
    behind them are linked together by `finish` and emitted as one object, as before. So
    where the caller's Python is the longer side (a training step's backward graph), object
    code is made while it runs, and where LLVM is (the tiny Llama's GEMMs at O3), LLVM's
    queue is not lengthened by emissions, which each have a set-up of their own: emitting
    every part in the worker was 0.1 s slower on the tiny Llama (2026-12-02). The objects are
    kept apart (`ObjectCode.part_sizes`) and loaded one by one (`load_object`): joined into
    one relocatable object (`ld -r`), their local labels (`.LCPI0_0` starts again in each)
    would be bound by name to one object's constants. With `shared` (and a linker) they are
    all position independent and `finish` links them into one shared library for the disk
    cache. `phases` gets the worker's CPU seconds for parsing and optimizing, and emission's
    wherever it runs."""

    def __init__(self, target: Target, opt_level: int = OPT_LEVEL, phases: Optional[dict[str, float]] = None,
                 shared: bool = False) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.target, self.opt_level, self.phases = target, opt_level, phases
        #: Position-independent objects, linked into a shared library by `finish`.
        self.pic = shared and _linker() is not None
        self.texts: list[str] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torchburn-llvm")
        self._futures: list[Any] = []
        self._waiting = 0  # parts queued and not yet started (the worker's view of its queue)
        self._count_lock = threading.Lock()

    def add(self, llvm_ir: str) -> None:
        """Queue one module for parsing and optimization."""
        self.texts.append(llvm_ir)
        with self._count_lock:
            self._waiting += 1
        if self._futures:
            self._futures.append(self._pool.submit(self._optimize, llvm_ir))
            return
        # The first submit starts the worker thread: with a stack of its own size, not the
        # process default (2 MiB where `ulimit -s` is unlimited), as LLVM's recursive analyses
        # on large functions want (clang runs its compiles on 8 MiB threads).
        with _stack_size_lock:
            previous = threading.stack_size(LLVM_THREAD_STACK)
            try:
                self._futures.append(self._pool.submit(self._optimize, llvm_ir))
            finally:
                threading.stack_size(previous)

    def _optimize(self, llvm_ir: str) -> "_PartObject":
        """One part parsed and optimized, and emitted when nothing waits behind it (in the worker)."""
        with self._count_lock:
            self._waiting -= 1
        with _lock:
            mod = _optimize_one(llvm_ir, self.target, self.opt_level, self.phases)
            with self._count_lock:
                idle = self._waiting == 0
            level = part_opt_level(llvm_ir, self.opt_level)
            return _emit_part(mod, self.target, level, self.pic, self.phases) if idle else _PartObject(mod, level)

    def finish(self) -> ObjectCode:
        """Wait for every part; the rest linked and emitted; the objects checked (a part's error
        is raised here)."""
        if not self._futures:
            raise JITError("no module to compile")
        parts: list[_PartObject] = [f.result() for f in self._futures]
        pending = [p for p in parts if p.data is None]
        with _lock:
            if pending:
                t0 = time.thread_time()
                rest = _linked([p.module for p in pending])
                parts = [p for p in parts if p.data is not None]
                parts.append(_emit_part(rest, self.target, max(p.level for p in pending), self.pic, self.phases))
                del rest
                if self.phases is not None:  # (the caller's thread: `llvm_emit` less this is the worker's)
                    self.phases["llvm_emit_caller"] = self.phases.get("llvm_emit_caller", 0.0) + time.thread_time() - t0
            _check_calls(_undefined_calls(self.texts))
        objects = [p.data for p in parts if p.data is not None]
        w0 = time.perf_counter()
        shared_lib = _link_shared(objects) if self.pic else b""
        if self.phases is not None:
            self.phases["llvm_link"] = self.phases.get("llvm_link", 0.0) + time.perf_counter() - w0
        if self.pic and not shared_lib:  # MCJIT will load them: emitted again, see `load_native`
            with _lock:
                objects = [bytes(_cached_target_machine(self.target, p.level).emit_object(p.module))
                           for p in parts if p.module is not None]
        for p in parts:
            p.module = None
        sizes = tuple(len(o) for o in objects) if len(objects) > 1 else ()
        return ObjectCode(b"".join(objects), self.target.triple, self.target.cpu, self.target.features,
                          shared_lib, sizes)

    def close(self) -> None:
        """Drop queued parts and stop the worker (after `finish`, or when emitting failed)."""
        for f in self._futures:
            f.cancel()
        self._pool.shutdown(wait=True)


class _PartObject:
    """One optimized part: its object file once emitted, else its module (to be linked with the
    other parts not emitted yet) and its optimization level."""

    __slots__ = ("module", "level", "data")

    def __init__(self, module: Optional[llvm.ModuleRef], level: int, data: Optional[bytes] = None) -> None:
        self.module, self.level, self.data = module, level, data


def _emit_part(mod: llvm.ModuleRef, target: Target, opt_level: int, pic: bool,
               phases: Optional[dict[str, float]]) -> _PartObject:
    """The object file of an optimized module (the caller holds `_lock`)."""
    t0 = time.thread_time()
    tm = _pic_target_machine(target, opt_level) if pic else _cached_target_machine(target, opt_level)
    data = bytes(tm.emit_object(mod))
    if phases is not None:
        phases["llvm_emit"] = phases.get("llvm_emit", 0.0) + time.thread_time() - t0
    return _PartObject(mod if pic else None, opt_level, data)


#: A function an LLVM IR text defines or declares (its name group 2, quoted or not).
_FUNCTION_LINE = re.compile(r'^(define|declare)\b[^@\n]*@(?:"((?:[^"\\]|\\.)*)"|([-\w.$]+))\(', re.M)


def _undefined_calls(texts: "list[str]") -> list[str]:
    """Functions the modules `texts` declare and none of them defines (LLVM's intrinsics aside),
    read from the text by the caller's thread: a walk of the modules' functions in LLVM's
    thread would call into LLVM (and wait for the GIL) a few times per function."""
    defined: set[str] = set()
    declared: list[str] = []
    for text in texts:
        for m in _FUNCTION_LINE.finditer(text):
            name = m.group(2) if m.group(2) is not None else m.group(3)
            if m.group(1) == "define":
                defined.add(name)
            elif not name.startswith("llvm."):
                declared.append(name)
    return [n for n in declared if n not in defined]


@functools.lru_cache(maxsize=1)
def _linker() -> Optional[str]:
    """The system linker, if there is one (`ld`)."""
    return shutil.which("ld")


@functools.lru_cache(maxsize=8)
def _pic_target_machine(target: Target, opt_level: int) -> llvm.TargetMachine:
    return _llvm_target(target).create_target_machine(
        cpu=target.cpu, features=target.features, opt=opt_level, reloc="pic", codemodel="small")


def _link_shared(pic_objects: "list[bytes]") -> bytes:
    """The objects linked into one shared library (undefined symbols such as `GOMP_parallel` or
    `expf` are resolved when it is loaded); empty when it cannot be linked."""
    linker = _linker()
    if not pic_objects or not all(pic_objects) or linker is None:
        return b""
    with tempfile.TemporaryDirectory(prefix="torchburn-link-") as folder:
        lib = os.path.join(folder, "kernels.so")
        objs = [os.path.join(folder, f"part{i}.o") for i in range(len(pic_objects))]
        for path, data in zip(objs, pic_objects):
            with open(path, "wb") as f:
                f.write(data)
        try:
            done = subprocess.run([linker, "-shared", "-o", lib, *objs], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as err:
            log.debug("torchburn: linking a shared library failed: %s", err)
            return b""
        if done.returncode != 0:
            log.debug("torchburn: linking a shared library failed: %s", done.stderr.strip())
            return b""
        with open(lib, "rb") as f:
            return f.read()


def _check_external_symbols(mod: llvm.ModuleRef) -> None:
    """Fail now, with names, if the code calls functions this process cannot provide: MCJIT
    would otherwise bind them to address 0 and the first call would crash."""
    _check_calls(f.name for f in mod.functions if f.is_declaration and not f.name.startswith("llvm."))


def _check_calls(names: "Iterable[str]") -> None:
    """`_check_external_symbols` for the functions `names` (declared, defined nowhere in the code)."""
    _init_llvm()
    external = list(dict.fromkeys(names))
    if any(n.startswith(("GOMP_", "omp_")) for n in external):
        _openmp(required=True)
    missing = [n for n in external if not llvm.address_of_symbol(n)]
    if missing:
        raise JITError(f"generated code calls functions this process does not provide: {missing}")


#: Symbols the object loader defines itself (the ELF global offset table of PIC code).
_LINKER_DEFINED = frozenset({"_GLOBAL_OFFSET_TABLE_"})


def _check_object_symbols(obj: ObjectCode) -> None:
    """Refuse an object that calls a function this process lacks, naming it. The object's own
    symbol table is read, not the IR's declarations: the code generator adds calls of its own
    (compiler-rt helpers for operations the CPU has no instruction for), and MCJIT binds a
    symbol it cannot find to address 0, a crash at the first call. A symbol one part of the
    program needs and another defines is bound between them. Objects that are not ELF (Mach-O,
    COFF) are not read; `_check_external_symbols` checked their IR when compiled."""
    undefined: set[str] = set()
    defined: set[str] = set()
    for data in obj.objects:
        symbols = elf_symbols(data)
        if symbols is None:
            return
        undefined.update(symbols[0])
        defined.update(symbols[1])
    missing = sorted({n for n in undefined - defined
                      if n not in _LINKER_DEFINED and not llvm.address_of_symbol(n)})
    if missing:
        raise JITError(f"the native code calls functions this process does not provide: {missing} "
                       "(a compiler runtime function the code generator used where the CPU lacks an "
                       "instruction, or a library that is not loaded)")


def optimized_ir(llvm_ir: str, target: Target, opt_level: int = OPT_LEVEL) -> str:
    """The LLVM IR after optimization (for dumps and tests)."""
    with _lock:
        mod, _ = _optimized_module(llvm_ir, target, opt_level)
        return str(mod)


def assembly(llvm_ir: str, target: Target, opt_level: int = OPT_LEVEL) -> str:
    """Assembly of the optimized module (for `TORCHBURN_DUMP`)."""
    with _lock:
        mod, tm = _optimized_module(llvm_ir, target, opt_level)
        return tm.emit_assembly(mod)


# ---- load --------------------------------------------------------------------------------------

class NativeModule:
    """Loaded machine code. Callables from `entry` keep it alive; raw `address`es do not."""

    def __init__(self, engine: llvm.ExecutionEngine, obj: ObjectCode) -> None:
        self._engine = engine
        self.object = obj
        self._entries: dict[str, Callable[..., None]] = {}

    def address(self, name: str) -> int:
        """Address of an exported function; raises KeyError if there is none of that name."""
        addr = self._engine.get_function_address(name)
        if not addr:
            raise KeyError(f"native module has no function {name!r}")
        return addr

    def entry(self, name: str) -> Callable[..., None]:
        """The entry function `name` as a ctypes callable (buffers, symbols, workspace)."""
        fn = self._entries.get(name)
        if fn is None:
            fn = ENTRY_FUNCTYPE(self.address(name))
            fn.native_module = self  # the code lives as long as a callable into it
            self._entries[name] = fn
        return fn


def load_object(obj: Union[ObjectCode, bytes]) -> NativeModule:
    """Link an object file into the process (MCJIT: an empty module, then the object).
    Plain bytes are taken as an object for the host."""
    from ..codegen.target import Target, host_target

    if not isinstance(obj, ObjectCode):
        host = host_target()
        obj = ObjectCode(bytes(obj), host.triple, host.cpu, host.features)
    _init_llvm()
    _openmp(required=obj.uses_openmp)
    _check_object_symbols(obj)
    check_tile_state(obj)
    target = Target.from_features(obj.triple, obj.cpu, obj.features)
    with _lock:
        holder = llvm.parse_assembly("")
        holder.triple = obj.triple
        engine = llvm.create_mcjit_compiler(holder, _target_machine(target, 3))
        for data in obj.objects:  # each part on its own: its local labels stay its own
            engine.add_object_file(llvm.ObjectFileRef.from_data(data))
        engine.finalize_object()
        threads.attach(lambda name: engine.get_global_value_address(name) or None)
        faults.attach(lambda name: engine.get_global_value_address(name) or None)
    return NativeModule(engine, obj)


def load_native(obj: ObjectCode) -> Any:
    """The code of `obj` in this process: its shared library through the dynamic loader where
    it has one, else the object through MCJIT (`load_object`).

    An object emitted for a shared library is position independent in the small code model: it
    reaches its constants and its other sections by 32-bit offsets. MCJIT places code and data
    sections in separate mappings, which in a process that has mapped gigabytes since (model
    weights, KV caches) can lie more than 2 GB apart: the relocation then does not fit, and
    LLVM aborts the process (an assertion in builds that keep them) or writes a truncated
    offset. The dynamic loader maps a library in one piece. Objects meant for MCJIT are emitted
    by the JIT's target machine (large code model: 64-bit addresses), as `compile_llvm_ir`
    and `ModuleParts` do when the library does not link."""
    if obj.shared:
        return load_shared(obj)
    return load_object(obj)


def compile_and_load(llvm_ir: str, target: Target, opt_level: int = OPT_LEVEL) -> NativeModule:
    """`load_object(compile_llvm_ir(...))`, for tests and one-off use."""
    return load_object(compile_llvm_ir(llvm_ir, target, opt_level))
