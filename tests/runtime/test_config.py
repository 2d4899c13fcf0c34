"""runtime/config.py: every variable of the README's configuration table is read, a bad value
fails at `torch.compile()` naming the variable, and each variable sets what the table says."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from torchburn.runtime import config
from torchburn.runtime.config import Config, ConfigError

README = Path(__file__).resolve().parents[2] / "README.md"

#: Per variable: a value and the Config field it must set (what the table says it does), and a
#: value it must refuse (None: every string is meaningful, a folder or a flag).
EXPECTED: dict[str, tuple[str, str, Any, "str | None"]] = {
    "TORCHBURN_DEVICE": ("gpu", "device", "gpu", "tpu"),
    "TORCHBURN_ENGINE": ("reference", "engine", "reference", "cuda"),
    "TORCHBURN_WGPU_BACKEND": ("vulkan", "wgpu_backend", "vulkan", "directx9"),
    "TORCHBURN_CACHE_SIZE": ("7", "cache_size", 7, "0"),
    "TORCHBURN_CACHE_DIR": ("off", "cache_dir", None, None),
    "TORCHBURN_CACHE_MAX_GB": ("0.5", "cache_max_bytes", 1 << 29, "-1"),
    "TORCHBURN_NUM_THREADS": ("3", "num_threads", 3, "-2"),
    "TORCHBURN_DEBUG": ("1", "debug", True, None),
    "TORCHBURN_DUMP": ("/tmp/tb-dump", "dump_dir", Path("/tmp/tb-dump"), None),
    "TORCHBURN_QLINEAR_ACTIVATIONS": ("f32", "qlinear_activations", "f32", "int4"),
    "TORCHBURN_QLINEAR_INVARIANT": ("1", "qlinear_invariant", True, None),
    "TORCHBURN_TARGET": ("avx2", "target", "avx2", "sparc"),
    "TORCHBURN_STRICT": ("1", "strict", True, None),
    "TORCHBURN_TUNE": ("cached", "tune", "cached", "fast"),
    "TORCHBURN_TUNE_BUDGET": ("2.5", "tune_budget_s", 2.5, "-1"),
    "TORCHBURN_ADAPTIVE_THREADS": ("0", "adaptive_threads", False, None),
}


def readme_variables() -> list[str]:
    """The variables in the README's configuration table (rows `| `TORCHBURN_X` | ...`)."""
    return re.findall(r"^\| `(TORCHBURN_[A-Z_]+)` \|", README.read_text(), re.M)


class RecordingEnv(dict):  # type: ignore[type-arg]
    """An environment that remembers which names were asked for."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.asked.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> Any:
        self.asked.add(key)
        return super().__getitem__(key)


def test_the_table_lists_every_variable_config_knows() -> None:
    assert sorted(readme_variables()) == sorted(EXPECTED)


def test_every_variable_in_the_table_is_read() -> None:
    env = RecordingEnv()
    Config.from_env(env)
    assert set(readme_variables()) <= env.asked


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_variable_sets_its_field(name: str) -> None:
    value, field, expected, _ = EXPECTED[name]
    default = Config.from_env({})
    got = Config.from_env({name: value})
    assert getattr(got, field) == expected
    assert getattr(got, field) != getattr(default, field)


@pytest.mark.parametrize("name", sorted(n for n, e in EXPECTED.items() if e[3] is not None))
def test_bad_values_name_the_variable(name: str) -> None:
    bad = EXPECTED[name][3]
    with pytest.raises(ConfigError, match=name):
        Config.from_env({name: bad})


@pytest.mark.parametrize("name, bad", [("TORCHBURN_CACHE_SIZE", "many"), ("TORCHBURN_NUM_THREADS", "-2")])
def test_bad_values_fail_at_torch_compile(name: str, bad: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from torch._dynamo.backends import registry

    registry.lookup_backend("torchburn")  # registered as in any process that used it
    saved = dict(registry._COMPILER_FNS), dict(registry._BACKENDS)
    monkeypatch.setenv(name, bad)
    monkeypatch.setattr(config, "_config", None)  # read the environment again
    registry._COMPILER_FNS.pop("torchburn", None)  # load the entry point again, as a fresh process
    registry._BACKENDS["torchburn"] = saved[1]["torchburn"] or _entry_point()
    try:
        with pytest.raises(ConfigError, match=name):
            torch.compile(lambda x: x + 1, backend="torchburn")  # before any call
    finally:
        monkeypatch.undo()
        registry._COMPILER_FNS.clear()
        registry._COMPILER_FNS.update(saved[0])
        registry._BACKENDS.clear()
        registry._BACKENDS.update(saved[1])
        config.reload_config()


def _entry_point():  # type: ignore[no-untyped-def]
    from importlib.metadata import entry_points

    return entry_points(group="torch_dynamo_backends")["torchburn"]


def test_wgpu_backend_auto_is_wgpus_choice() -> None:
    assert Config.from_env({"TORCHBURN_WGPU_BACKEND": "auto"}).wgpu_backend is None
    assert Config.from_env({"TORCHBURN_WGPU_BACKEND": "Vulkan"}).wgpu_backend == "vulkan"
    with pytest.raises(ConfigError, match="or auto"):
        Config.from_env({"TORCHBURN_WGPU_BACKEND": "opengl"})
