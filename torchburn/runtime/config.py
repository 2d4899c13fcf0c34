"""Every TORCHBURN_* environment variable, read in this one place.

| variable | meaning | default |
|---|---|---|
| TORCHBURN_DEVICE | cpu, gpu or auto | cpu |
| TORCHBURN_ENGINE | llvm (alias native_cpu), wgpu (aliases burn_wgpu, burn-wgpu) or reference (aliases burn_ndarray, burn-ndarray, burn) | llvm |
| TORCHBURN_WGPU_BACKEND | vulkan, metal, dx12 or gl | (wgpu's choice) |
| TORCHBURN_CACHE_SIZE | compiled modules kept in memory (LRU) | 256 |
| TORCHBURN_CACHE_DIR | on-disk cache folder; "off" disables it | user cache dir |
| TORCHBURN_CACHE_MAX_GB | bound of the on-disk cache folder in GiB (least recently used entries go first; a model's weight cache entry may take half) | 16 |
| TORCHBURN_NUM_THREADS | threads of generated parallel loops (0: OpenMP's default; runtime/threads.py) | 0 |
| TORCHBURN_DEBUG | 1 turns on diagnostic logging (and raises internal compiler errors, as STRICT); bounds makes generated code check every load and store against its buffer (runtime/faults.py); both: 1,bounds | 0 |
| TORCHBURN_STRICT | 1: an internal compiler error raises instead of falling back to PyTorch (the test suite runs so) | 0 |
| TORCHBURN_DUMP | folder to write IR after every pass, LLVM IR and assembly | (off) |
| TORCHBURN_TARGET | the CPU to compile for: host, avx2 (x86-64-v3), avx512 (skylake-avx512), znver4, neon (aarch64), or triple:cpu:features; code for another CPU is emitted (object code, assembly), not run | host |
| TORCHBURN_TUNE | off (every kernel is ours, nothing measured), cached (measured choices from the disk cache, else ours) or search (measure the candidates of a kernel on its real shapes, within the budget; docs/tuning.md) | search |
| TORCHBURN_TUNE_BUDGET | seconds the tuner may spend measuring per compiled graph (search mode) | 30 |
| TORCHBURN_QLINEAR_ACTIVATIONS | quantized linears on CPU: int8 (x quantized per group, byte dot products), f32, or auto (int8 where the CPU has VNNI dot products, and for int4 weights on x86-64 with SSSE3 or later: pmaddubsw); weights kept in ggml blocks (GGUF Q5_x and K-quants) take int8 activations where the CPU has byte dot products (VNNI, or pmaddubsw for decode), f32 ones otherwise | auto |
"""
from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional


class ConfigError(ValueError):
    """An environment variable has a value torchburn does not accept."""


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    value = env.get(name, default).strip().lower() or default
    if value not in choices:
        raise ConfigError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


#: `TORCHBURN_ENGINE`'s values: each engine's name, and the names the seed README gives them.
ENGINES: tuple[str, ...] = ("llvm", "wgpu", "reference")
ENGINE_ALIASES: dict[str, str] = {
    "native_cpu": "llvm", "native-cpu": "llvm",
    "burn_wgpu": "wgpu", "burn-wgpu": "wgpu",
    "burn_ndarray": "reference", "burn-ndarray": "reference", "burn": "reference",
}


def engine_name(value: str) -> str:
    """The engine `value` names (an engine or one of its aliases); ConfigError naming every
    accepted spelling otherwise."""
    v = value.strip().lower()
    if v in ENGINES:
        return v
    if v in ENGINE_ALIASES:
        return ENGINE_ALIASES[v]
    spellings = ", ".join(f"{e} ({'/'.join(a for a, t in ENGINE_ALIASES.items() if t == e)})" for e in ENGINES)
    raise ConfigError(f"TORCHBURN_ENGINE={value!r}: expected one of {spellings}")


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value}: must be >= {minimum}")
    return value


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{name}={raw!r}: expected a finite number of seconds >= 0")
    return value


def _gib(env: Mapping[str, str], name: str, default: float) -> int:
    """A size in GiB (a positive, finite number; fractions allowed) as bytes."""
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return int(default * (1 << 30))
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected a number of GiB") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{name}={raw!r}: expected a finite number of GiB > 0")
    return int(value * (1 << 30))


#: `TORCHBURN_TUNE`'s values (`runtime/tuner.py`).
TUNE_MODES: tuple[str, ...] = ("off", "cached", "search")


def _target_name(env: Mapping[str, str]) -> str:
    """`TORCHBURN_TARGET`, normalized; the CPUs it can name are in `codegen/target_names.py`."""
    from ..codegen.target_names import check_target_name

    raw = env.get("TORCHBURN_TARGET", "")
    try:
        return check_target_name(raw)
    except ValueError as err:
        raise ConfigError(f"TORCHBURN_TARGET={raw.strip()!r}: {err}") from None
def _flag(env: Mapping[str, str], name: str, default: str = "0") -> bool:
    return env.get(name, default).strip().lower() not in ("", "0", "false", "no", "off")


#: The words of TORCHBURN_DEBUG that are not a plain on/off flag.
DEBUG_MODES = ("bounds",)


def _debug(env: Mapping[str, str]) -> tuple[bool, bool]:
    """TORCHBURN_DEBUG as (logging, bounds checks): comma-separated words, each a flag value
    (`1`, `yes`, ... turn logging on) or a mode of `DEBUG_MODES`."""
    raw = env.get("TORCHBURN_DEBUG", "0").strip().lower()
    words = [w.strip() for w in raw.split(",") if w.strip()]
    logging_on = bounds = False
    for w in words:
        if w == "bounds":
            bounds = True
        elif w not in ("0", "false", "no", "off"):
            logging_on = True
    return logging_on, bounds


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchburn"


@dataclass(frozen=True)
class Config:
    device: str
    engine: str
    wgpu_backend: Optional[str]
    cache_size: int
    cache_dir: Optional[Path]
    #: `TORCHBURN_CACHE_MAX_GB` in bytes: the disk cache's bound.
    cache_max_bytes: int
    num_threads: int
    debug: bool
    dump_dir: Optional[Path]
    #: `TORCHBURN_DEBUG=bounds`: generated code checks every load and store against its buffer
    #: and the launcher raises `faults.OutOfBounds` naming kernel, buffer and index.
    bounds_check: bool = False
    #: "int8", "f32" or "auto": the activations of `qlinear` kernels (docs/quantization.md).
    qlinear_activations: str = "auto"
    #: `TORCHBURN_QLINEAR_INVARIANT`: every `qlinear` takes its rows form whatever its rows of x
    #: (no panel, tile or dequantize + GEMM form, no tuner choice), so each row's result is the
    #: same bits alone and beside others (docs/quantization.md, "Batch invariance").
    qlinear_invariant: bool = False
    #: The CPU code is compiled for (`codegen/target.py` resolves the name; "host" by default).
    target: str = "host"
    #: An internal compiler error raises (`backend.InternalCompilerError`) instead of leaving
    #: the subgraph to PyTorch. Capability misses (no lowering for an op) still fall back.
    strict: bool = False
    #: `TORCHBURN_TUNE`: whether the tuner may measure candidates ("search"), only apply
    #: measurements found in the disk cache ("cached"), or stay out ("off": every kernel ours).
    tune: str = "search"
    #: `TORCHBURN_TUNE_BUDGET`: seconds of measuring per compiled graph in "search" mode.
    tune_budget_s: float = 30.0
    #: `TORCHBURN_ADAPTIVE_THREADS`: the LLM engine's CPU steps choose their team size by
    #: measured step time, at most the configured count (`llm/runtime/thread_governor.py`).
    adaptive_threads: bool = True

    @property
    def wants_gpu(self) -> bool:
        """Whether the GPU engine may run graphs (`TORCHBURN_DEVICE=gpu|auto` or
        `TORCHBURN_ENGINE=wgpu`, unless the reference engine is asked for). When not, nothing
        of the GPU engine (WGSL code generator, GPU passes, wgpu) needs importing."""
        if self.engine == "reference":
            return False
        return self.device in ("gpu", "auto") or self.engine == "wgpu"

    @staticmethod
    def from_env(env: Optional[Mapping[str, str]] = None) -> "Config":
        env = os.environ if env is None else env
        backend = env.get("TORCHBURN_WGPU_BACKEND", "").strip().lower() or None
        if backend == "auto":  # the seed's spelling of "wgpu's choice"
            backend = None
        if backend is not None and backend not in ("vulkan", "metal", "dx12", "gl"):
            raise ConfigError(f"TORCHBURN_WGPU_BACKEND={backend!r}: expected vulkan, metal, dx12, gl or auto")
        cache_raw = env.get("TORCHBURN_CACHE_DIR", "").strip()
        cache_dir = None if cache_raw.lower() in ("off", "0", "none") else Path(cache_raw) if cache_raw else _default_cache_dir()
        dump = env.get("TORCHBURN_DUMP", "").strip()
        debug, bounds = _debug(env)
        return Config(
            device=_choice(env, "TORCHBURN_DEVICE", "cpu", ("cpu", "gpu", "auto")),
            engine=engine_name(env.get("TORCHBURN_ENGINE", "").strip() or "llvm"),
            wgpu_backend=backend,
            cache_size=_int(env, "TORCHBURN_CACHE_SIZE", 256, minimum=1),
            cache_dir=cache_dir,
            cache_max_bytes=_gib(env, "TORCHBURN_CACHE_MAX_GB", 16.0),
            num_threads=_int(env, "TORCHBURN_NUM_THREADS", 0),
            debug=debug,
            dump_dir=Path(dump) if dump else None,
            bounds_check=bounds,
            qlinear_activations=_choice(env, "TORCHBURN_QLINEAR_ACTIVATIONS", "auto", ("auto", "int8", "f32")),
            qlinear_invariant=_flag(env, "TORCHBURN_QLINEAR_INVARIANT"),
            target=_target_name(env),
            strict=_flag(env, "TORCHBURN_STRICT"),
            tune=_choice(env, "TORCHBURN_TUNE", "search", TUNE_MODES),
            tune_budget_s=_seconds(env, "TORCHBURN_TUNE_BUDGET", 30.0),
            adaptive_threads=_flag(env, "TORCHBURN_ADAPTIVE_THREADS", "1"),
        )


_config: Optional[Config] = None
_log_handler: Optional[logging.Handler] = None


def setup_logging(config: Config) -> None:
    """`TORCHBURN_DEBUG=1`: the `torchburn` logger logs everything (DEBUG and up) to stderr
    through one handler, installed once per process. Without it logging is left to the
    application (warnings still reach stderr through Python's last-resort handler)."""
    global _log_handler
    if not config.debug or _log_handler is not None:
        return
    logger = logging.getLogger("torchburn")
    _log_handler = logging.StreamHandler(sys.stderr)
    _log_handler.setFormatter(logging.Formatter("[torchburn %(levelname)s] %(message)s"))
    logger.addHandler(_log_handler)
    logger.setLevel(logging.DEBUG)


def get_config() -> Config:
    """The configuration of this process (read once; `reload_config()` reads again)."""
    global _config
    if _config is None:
        _config = Config.from_env()
        setup_logging(_config)
    return _config


def reload_config() -> Config:
    global _config
    _config = Config.from_env()
    setup_logging(_config)
    return _config
