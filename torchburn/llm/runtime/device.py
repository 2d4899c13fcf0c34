"""Which engine runs the model: ``cpu`` (LLVM), ``gpu`` (wgpu), or ``auto`` (the GPU when a real,
non-software adapter is present).  The choice is the process's TorchBurn configuration
(``TORCHBURN_DEVICE``), so it is set here, once, for everything compiled afterwards."""
from __future__ import annotations

import os
from typing import Optional

DEVICES = ("auto", "cpu", "gpu")


def _no_gpu_device_files() -> bool:
    """Whether this is Linux without any GPU device file: every hardware driver wgpu can use
    there (Vulkan, GL) needs a DRM render node, an NVIDIA device file or AMD's /dev/kfd; with
    none, asking wgpu (seconds: it parses its C headers, then probes the drivers) can only
    find a software adapter."""
    import glob
    import sys

    if not sys.platform.startswith("linux"):
        return False
    return not (glob.glob("/dev/dri/renderD*") or glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd"))


def real_gpu_present() -> bool:
    if _no_gpu_device_files():
        return False
    from ...runtime.gpu import gpu_info

    info = gpu_info()
    return info is not None and str(info.get("device_type", "")).lower() not in ("cpu", "")


def select_device(device: str, threads: Optional[int]) -> str:
    """Apply ``device`` and ``threads`` to the configuration; returns "cpu" or "gpu"."""
    from ...runtime.config import reload_config

    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}; got {device!r}")
    if threads is not None:
        if not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive integer; got {threads!r}")
        import torch

        torch.set_num_threads(threads)
        os.environ["TORCHBURN_NUM_THREADS"] = str(threads)
    chosen = device
    if device == "auto":
        chosen = "gpu" if real_gpu_present() else "cpu"
    if chosen == "gpu":  # imported only then: it brings the WGSL code generator
        from ...runtime.gpu import gpu_available, gpu_unavailable_reason

        if not gpu_available():
            raise RuntimeError(f"device='gpu' but no GPU adapter is usable: {gpu_unavailable_reason()}")
    os.environ["TORCHBURN_DEVICE"] = chosen
    reload_config()
    return chosen
