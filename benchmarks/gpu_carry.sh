#!/usr/bin/env bash
# Builds `.gl/`, what benchmarks/h200.sh needs carried to the lent GPU machine (Python 3.12 and
# PyTorch with CUDA there, but no wgpu, no Vulkan loader and no network): the Vulkan/GL loader
# .debs, and xz-packed folders of the wheels for Python 3.12 / manylinux (site.tar.xz: wgpu and
# the pure-Python test and package dependencies; llvmlite.tar.xz; numpy.tar.xz, unpacked there
# only where the image lacks numpy). Together with the tracked files they must stay under a
# run's 64 MiB (about 60 MB on 2026-12-06). Run once from the repository root; name `.gl` in
# every run's `carry`.
set -eu
grep -qx '/.gl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.gl/ >> .git/info/exclude; }
mkdir -p .gl /tmp/amd64/partial
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
# shellcheck disable=SC2086
apt-get $o update >/dev/null
# libglvnd0 and its GL/EGL siblings beside libvulkan1: NVIDIA's Vulkan driver needs libGLdispatch
# shellcheck disable=SC2086
(cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
whl=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$whl" "wgpu>=0.32,<0.33" cffi pycparser rendercanvas sniffio blake3 gguf pyelftools pyyaml tqdm \
    pytest pytest-timeout hypothesis pluggy iniconfig packaging sortedcontainers attrs llvmlite numpy
pack() {  # pack <name> <wheel glob>...: unzip the wheels into one folder, tar | xz -9 it
    local name=$1 dir; shift; dir=$(mktemp -d)
    for w in "$@"; do unzip -q -o "$w" -d "$dir"; done
    tar -cf - -C "$dir" . | xz -9 -T0 > ".gl/$name.tar.xz"; rm -rf "$dir"
}
pack llvmlite "$whl"/llvmlite-*.whl
pack numpy "$whl"/numpy-*.whl
rm "$whl"/llvmlite-*.whl "$whl"/numpy-*.whl
pack site "$whl"/*.whl
rm -rf "$whl"
du -ch .gl/* | tail -1
