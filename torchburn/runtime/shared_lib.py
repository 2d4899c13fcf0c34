"""Object code and its loading without LLVM: what a warm process needs to call cached kernels.

A compiled program is kept as relocatable objects (`ObjectCode.data`), which MCJIT links into
the process (`jit.load_object`, needing llvmlite and its ~20 ms import). When a system linker
(`ld`) is at hand, `jit.compile_llvm_ir(..., shared=True)` also emits a position-independent
object and links it into a shared library (`ObjectCode.shared`); `load_shared` then loads that
with the dynamic loader alone, from a file this process writes into its own private folder, so
the bytes that were checked are the bytes loaded. The OpenMP runtime torch ships and the C math library are
made globally visible first, so the library's `GOMP_parallel` and `expf` resolve to the same
ones the MCJIT path uses; a symbol that does not resolve fails the load, never a call.

This module imports only the standard library.
"""
from __future__ import annotations

import _ctypes
import atexit
import ctypes
import ctypes.util
import functools
import glob
import hashlib
import importlib.util
import io
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass
from typing import Callable, Optional

from . import faults, threads

#: Resolve every symbol when loading (a missing one fails the load, not a later call).
_BIND_NOW = getattr(os, "RTLD_NOW", 2) | getattr(os, "RTLD_LOCAL", 0)

#: The C type of every entry function: void(ptr buffers, ptr symbols, ptr workspace).
ENTRY_FUNCTYPE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


@dataclass(frozen=True)
class ObjectCode:
    """Relocatable object code for one target, ready for `jit.load_object` or the disk cache;
    `shared` is the same code linked into a shared library for `load_shared` (empty when no
    linker was available).

    `data` is one object file, or several laid end to end (`part_sizes`: their sizes, in
    order) when a program was emitted a module at a time (`jit.ModuleParts`): each is loaded as
    an object of its own, so every part keeps its own local labels (`.LCPI0_0` starts again in
    each), and calls between parts are bound by their global names."""

    data: bytes
    triple: str
    cpu: str
    features: str
    shared: bytes = b""
    #: The sizes of the object files `data` holds, in order; empty: `data` is one object.
    part_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.part_sizes and sum(self.part_sizes) != len(self.data):
            raise ValueError(f"object parts of {sum(self.part_sizes)} bytes in all, data of {len(self.data)}")

    @property
    def objects(self) -> tuple[bytes, ...]:
        """The object files, each to be loaded on its own."""
        if not self.part_sizes:
            return (self.data,)
        out, pos = [], 0
        for n in self.part_sizes:
            out.append(self.data[pos:pos + n])
            pos += n
        return tuple(out)

    @property
    def uses_openmp(self) -> bool:
        """Whether the code calls into libgomp (it has parallel loops)."""
        return b"GOMP_parallel" in self.data


def undefined_symbols(data: bytes) -> Optional[list[str]]:
    """The names an ELF relocatable object needs from elsewhere (undefined global and weak
    symbols of its symbol tables), or None when `data` is not a readable ELF object (Mach-O,
    COFF, truncated). Read with pyelftools because the backend adds calls LLVM IR never
    declared (compiler-rt's `__truncsfbf2` for a bf16 operation the CPU lacks), and a call the
    loader cannot bind must fail the load, not jump to address 0."""
    symbols = elf_symbols(data)
    return None if symbols is None else symbols[0]


def elf_symbols(data: bytes) -> Optional[tuple[list[str], list[str]]]:
    """`(undefined, defined)` global and weak symbol names of an ELF relocatable object (see
    `undefined_symbols`), or None when `data` is not a readable ELF object."""
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    if not data.startswith(b"\x7fELF"):
        return None
    undefined: list[str] = []
    defined: list[str] = []
    try:
        elf = ELFFile(io.BytesIO(data))
        for section in elf.iter_sections():
            if not isinstance(section, SymbolTableSection):
                continue
            for sym in section.iter_symbols():
                if not sym.name or sym["st_info"]["bind"] not in ("STB_GLOBAL", "STB_WEAK"):
                    continue
                (undefined if sym["st_shndx"] == "SHN_UNDEF" else defined).append(sym.name)
    except Exception:  # noqa: BLE001 - pyelftools raises assorted errors on malformed input
        return None
    return undefined, defined


def find_libgomp() -> Optional[str]:
    """Path of the libgomp to use: torch's bundled copy if torch has one, else the system's."""
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            found = sorted(glob.glob(os.path.join(root, "lib", "libgomp*.so*")))
            if found:
                return found[0]
    return ctypes.util.find_library("gomp")


@functools.lru_cache(maxsize=None)
def _global_library(name: str) -> bool:
    """Make a library's symbols visible to libraries loaded later (RTLD_GLOBAL)."""
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
        return True
    except OSError:
        return False


def _prepare(uses_openmp: bool) -> None:
    for libm in ("libm.so.6", ctypes.util.find_library("m") or "libm.so"):
        if _global_library(libm):
            break
    _global_library("libgcc_s.so.1")  # compiler runtime functions, as `jit._init_llvm` loads them
    if uses_openmp:
        path = find_libgomp()
        if path is None or not _global_library(path):
            raise OSError("the code has parallel loops but no OpenMP runtime (libgomp) could be loaded")


class SharedModule:
    """A loaded shared library of kernels; callables from `entry` keep it alive."""

    def __init__(self, lib: ctypes.CDLL, obj: ObjectCode) -> None:
        self._lib = lib
        self.object = obj
        self._entries: dict[str, Callable[..., None]] = {}
        # The library goes when the module does (as an MCJIT engine's code does): a process
        # that compiles many programs (the tuner's candidates) does not keep them all mapped.
        # Every callable from `entry` holds the module, so none outlives the code.
        # (Not at exit: a daemon thread may still be inside the code.)
        close = getattr(_ctypes, "dlclose", None)
        if close is not None:
            weakref.finalize(self, close, lib._handle).atexit = False

    def address(self, name: str) -> int:
        try:
            return ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value or 0
        except AttributeError:
            raise KeyError(f"shared library has no function {name!r}") from None

    def entry(self, name: str) -> Callable[..., None]:
        """The entry function `name` as a ctypes callable (buffers, symbols, workspace)."""
        fn = self._entries.get(name)
        if fn is None:
            fn = ENTRY_FUNCTYPE(self.address(name))
            fn.native_module = self  # type: ignore[attr-defined]  # the code lives as long as its callable
            self._entries[name] = fn
        return fn


@functools.lru_cache(maxsize=1)
def _private_folder() -> str:
    """A folder only this process writes to (mode 0700), removed when the process exits."""
    folder = tempfile.mkdtemp(prefix="torchburn-libs-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


def check_tile_state(obj: ObjectCode) -> None:
    """Code compiled for AMX (a cached object, say) runs only in a process that holds the tile
    state (`codegen/amx.py`): where the kernel refused it, the first tile instruction would kill
    the process, so loading says so instead."""
    if "+amx-tile" not in obj.features.split(","):
        return
    from ..codegen.amx import request_tiles

    if not request_tiles():
        raise RuntimeError("this code was compiled for AMX, but the kernel refused this process the AMX "
                           "tile state (arch_prctl ARCH_REQ_XCOMP_PERM); recompile for this process's "
                           "host target (which then has no AMX)")


def load_shared(obj: ObjectCode) -> SharedModule:
    """Load `obj.shared` with the dynamic loader; raises OSError when it cannot be loaded.

    The bytes (checked by the caller) are written to a new file in a private folder, loaded
    and unlinked. The file is named by a hash of its contents: the dynamic loader hands back an
    already-loaded library of the same name instead of loading the file, so a name must never
    stand for two different libraries (a reused `/proc/self/fd/N` would)."""
    if not obj.shared:
        raise OSError("no shared library in this object code")
    check_tile_state(obj)
    _prepare(obj.uses_openmp)
    path = os.path.join(_private_folder(), hashlib.sha256(obj.shared).hexdigest() + ".so")
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(obj.shared)
        os.replace(tmp, path)
        lib = ctypes.CDLL(path, mode=_BIND_NOW)
    finally:
        for leftover in (tmp, path):
            try:
                os.unlink(leftover)
            except OSError:
                pass
    threads.attach(lambda name: _global_address(lib, name))
    faults.attach(lambda name: _global_address(lib, name))
    return SharedModule(lib, obj)


def _global_address(lib: ctypes.CDLL, name: str) -> Optional[int]:
    """The address of a data symbol of `lib`, or None."""
    try:
        return ctypes.addressof(ctypes.c_void_p.in_dll(lib, name))
    except ValueError:
        return None
