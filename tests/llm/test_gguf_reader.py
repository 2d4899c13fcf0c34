"""`FastGGUFReader` against the `gguf` package's reader: the same metadata values and the same
tensors (name, type, shape, bytes), read in place; bad files give clear errors."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from torchburn.llm.model.gguf_reader import FastGGUFReader, GGUFFormatError

from .conftest import smollm_gguf, smollm_missing
from .test_gguf_loader import _small_gguf

GGUF = smollm_gguf()


def _same_as_gguf(path: Path) -> None:
    import gguf

    ref, ours = gguf.GGUFReader(str(path)), FastGGUFReader(path)
    kept = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}  # its header pseudo-fields
    assert list(ours.fields) == list(kept)
    for name, field in kept.items():
        assert ours.fields[name].contents() == field.contents(), name
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for a, b in zip(ours.tensors, ref.tensors):
        assert a.tensor_type == b.tensor_type and a.shape.tolist() == b.shape.tolist(), a.name
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape, a.name
        assert np.array_equal(np.asarray(a.data).view(np.uint8), np.asarray(b.data).view(np.uint8)), a.name
        assert not a.data.flags.owndata  # a view of the mapped file, no copy


def test_small_file_reads_like_gguf(tmp_path: Path) -> None:
    _same_as_gguf(_small_gguf(tmp_path / "ok.gguf"))


@pytest.mark.skipif(GGUF is None, reason=smollm_missing())
def test_default_model_reads_like_gguf() -> None:
    assert GGUF is not None
    _same_as_gguf(Path(GGUF))


def test_bad_files_are_clear_errors(tmp_path: Path) -> None:
    good = _small_gguf(tmp_path / "ok.gguf").read_bytes()
    for name, data in (("magic", b"GGML" + good[4:]), ("cut", good[:40]),
                       ("version", good[:4] + (9).to_bytes(4, "little") + good[8:])):
        bad = tmp_path / f"{name}.gguf"
        bad.write_bytes(data)
        with pytest.raises(GGUFFormatError):
            FastGGUFReader(bad)
