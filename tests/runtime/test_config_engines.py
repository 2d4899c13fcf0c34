"""`runtime/config.py`: engine names and their aliases, and the error for an unknown one."""
from __future__ import annotations

import pytest
import torch

from torchburn.runtime import config
from torchburn.runtime.config import ConfigError, Config


@pytest.mark.parametrize("value, engine", [
    ("", "llvm"), ("llvm", "llvm"), ("native_cpu", "llvm"), ("NATIVE-CPU", "llvm"),
    ("wgpu", "wgpu"), ("burn_wgpu", "wgpu"), ("burn-wgpu", "wgpu"),
    ("reference", "reference"), ("burn_ndarray", "reference"), ("burn-ndarray", "reference"), (" burn ", "reference"),
])
def test_engine_names_and_the_seed_readme_aliases(value: str, engine: str) -> None:
    assert Config.from_env({"TORCHBURN_ENGINE": value}).engine == engine
    assert Config.from_env({}).engine == "llvm"


def test_an_unknown_engine_names_every_choice() -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_env({"TORCHBURN_ENGINE": "ndarray"})
    message = str(info.value)
    assert message.startswith("TORCHBURN_ENGINE='ndarray': expected one of llvm (native_cpu/native-cpu), ")
    for spelling in ("wgpu", "burn_wgpu", "burn-wgpu", "reference", "burn_ndarray", "burn"):
        assert spelling in message


def test_active_engine_reports_the_reference_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchburn

    monkeypatch.setenv("TORCHBURN_ENGINE", "burn")
    monkeypatch.setenv("TORCHBURN_DEVICE", "gpu")  # the reference engine wins over a GPU request
    config.reload_config()
    try:
        assert torchburn.active_engine() == "reference"
        assert torchburn.active_engine(alias=True) == "burn_ndarray"
    finally:
        monkeypatch.undo()
        config.reload_config()
    assert torchburn.active_engine(alias=True) in ("native_cpu", "burn_wgpu")


def test_torch_compile_reports_a_bad_engine_as_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchburn.backend.entry import torchburn_backend

    monkeypatch.setenv("TORCHBURN_ENGINE", "ndarray")
    monkeypatch.setattr(config, "_config", None)
    torch._dynamo.reset()
    try:
        with pytest.raises(Exception) as info:
            torch.compile(lambda x: x + 1, backend=torchburn_backend)(torch.ones(2))
        # Dynamo wraps what a backend raises; the message and the inner exception are ours
        assert isinstance(getattr(info.value, "inner_exception", info.value), ConfigError), repr(info.value)
        assert "ConfigError: TORCHBURN_ENGINE='ndarray': expected one of llvm" in str(info.value)
    finally:
        monkeypatch.undo()
        config.reload_config()
        torch._dynamo.reset()
