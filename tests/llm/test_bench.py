"""`torchburn.llm.cli.bench`: what a decode step reads, and the parameter count."""
from __future__ import annotations

from torchburn.llm.cli.bench import decode_weight_bytes, parameter_count
from torchburn.llm.model.safetensors_loader import load_safetensors_model


def test_decode_weight_bytes_counts_a_tied_head_once(tiny_checkpoint) -> None:
    hf, folder = tiny_checkpoint("qwen2")  # tied embeddings
    model = load_safetensors_model(folder, None)
    c = model.config
    layers = sum(p.numel() for p in model.layers.parameters()) * 4
    head = c.vocab_size * c.hidden_size * 4
    assert decode_weight_bytes(model) == layers + c.hidden_size * 4 + head
    assert parameter_count(model) == sum(p.numel() for p in hf.parameters())


def test_decode_weight_bytes_of_a_quantized_model(tiny_checkpoint) -> None:
    """INT8 with f16 scales per 32 weights is 1.0625 bytes a weight against float32's 4
    (norms stay float32), and the embedding adds one row, not its table."""
    _, folder = tiny_checkpoint("llama")  # untied head
    f32 = decode_weight_bytes(load_safetensors_model(folder, None))
    int8 = decode_weight_bytes(load_safetensors_model(folder, "int8"))
    assert 3.6 < f32 / int8 < 4 / 1.0625


def test_peer_process_runs_pp_and_tg_and_reports_errors(tmp_path) -> None:
    """ik_llama.cpp (a `dev` dependency) in a process of its own on a tiny GGUF it quantized:
    pp and tg answer with seconds and the child's CPU time; a file it cannot load is a
    `PeerError` naming the peer, never a hang."""
    import pytest

    from tests.llm import ik_fixtures as ik
    from torchburn.llm.cli.peers import PeerError, PeerProcess, available

    reason = ik.ik_available()
    if reason is not None:
        pytest.skip(reason)
    assert "ik_llama.cpp" in available()
    gguf = ik.quantize(ik.write_base(tmp_path / "base.gguf", tied=False), tmp_path / "q8.gguf", "Q8_0")
    with PeerProcess("ik_llama.cpp", gguf, threads=1, context=64) as peer:
        assert peer.pp(16) > 0 and peer.last_cpu_s > 0
        assert peer.tg(4) > 0
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(PeerError, match="ik_llama.cpp"):
        PeerProcess("ik_llama.cpp", bad, threads=1, context=64)
    with pytest.raises(ValueError, match="unknown peer"):
        PeerProcess("vllm", gguf, threads=1, context=64)
