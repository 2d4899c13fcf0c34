"""`TORCHBURN_*` variables as the seed README spells them."""
from __future__ import annotations

import pytest

from torchburn.runtime.config import Config, ConfigError


def test_wgpu_backend_auto_is_wgpus_choice() -> None:
    assert Config.from_env({"TORCHBURN_WGPU_BACKEND": "auto"}).wgpu_backend is None
    assert Config.from_env({"TORCHBURN_WGPU_BACKEND": "Vulkan"}).wgpu_backend == "vulkan"
    with pytest.raises(ConfigError, match="or auto"):
        Config.from_env({"TORCHBURN_WGPU_BACKEND": "opengl"})
