"""The convolution suite (`tests/models/conv_zoo.py`) at its tiny size through the backend, in
strict mode, against eager: inference (`eval()` under `no_grad`) and a training step (`train()`,
`(out * w).sum().backward()`: the output, every parameter's gradient and batch norm's running
statistics), with nothing in PyTorch outside `NOT_COMPILED`.

Tolerances are the model suite's (`test_model_suite.py`): these nets are a few layers deep,
in float32; gradients are compared relative to the largest gradient entry of the model.

Compiling costs seconds even at tiny sizes (a training step compiles a forward and a backward
graph), so the default run takes every model once, in the mode `DEFAULT` names (training for
the classes whose backward issue 35 found slow, inference where batch norm is folded and for
the U-Net), 15 model tests in about 60 CPU-seconds (user time, 2-core machine at load 9);
`TORCHBURN_MODELS_FULL=1` runs both modes of every model, 28 tests in about 100 CPU-seconds.
"""
from __future__ import annotations

import copy

import pytest
import torch

from tests.models import conv_zoo
from tests.models.test_model_suite import (OUT_TOL, assert_compiled_whole, assert_grads_close, compiled,
                                           full_only, projection, recording)

#: The (model, mode) pairs of the default run; the others run with TORCHBURN_MODELS_FULL=1.
DEFAULT = {(n, "training") for n in ("resnet_blocks", "audio_encoder", "mobilenet_blocks", "small_cnn",
                                      "efficientnet_b0", "convnext_t", "wav2vec2_features", "unet", "conv3d")} | \
          {(n, "inference") for n in ("resnet18", "resnet50", "mobilenetv3_small", "mobilenetv3_large", "vgg11_bn",
                                       "unet")}


def _params(modes: tuple[str, ...]) -> list[object]:
    out = []
    for name in conv_zoo.CASES:
        for mode in modes:
            marks = () if (name, mode) in DEFAULT else full_only
            out.append(pytest.param(name, mode, marks=marks, id=f"{name}-{mode}"))
    return out


def test_default_run_covers_every_model() -> None:
    assert {n for n, _ in DEFAULT} == set(conv_zoo.CASES)


@pytest.mark.parametrize("name,mode", _params(("inference", "training")))
def test_conv_model(name: str, mode: str) -> None:
    case = conv_zoo.CASES[name]
    eager = conv_zoo.build(name, "tiny").train(mode == "training")
    kw = conv_zoo.inputs(name, "tiny", batch=2)
    model = copy.deepcopy(eager)
    f = compiled(model)
    if mode == "inference":
        with torch.no_grad():
            out, records = recording(lambda: case.pick(f(**kw)))
            expected = case.pick(eager(**kw))
        torch.testing.assert_close(out, expected, **OUT_TOL)
        assert {r.kind for r in records} == {"forward"}
        assert_compiled_whole(records)
        return

    def step() -> torch.Tensor:
        y = case.pick(f(**kw))
        (y * projection(y)).sum().backward()
        return y

    out, records = recording(step)
    expected = case.pick(eager(**kw))
    (expected * projection(expected)).sum().backward()
    torch.testing.assert_close(out, expected, **OUT_TOL)
    assert_grads_close(model, eager)
    for (bname, b), ref in zip(model.named_buffers(), eager.buffers()):  # batch norm's running statistics
        torch.testing.assert_close(b, ref, **OUT_TOL, msg=lambda m: f"{bname}: {m}")
    assert {r.kind for r in records} >= {"forward", "backward"}
    assert_compiled_whole(records)
