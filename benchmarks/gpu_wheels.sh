#!/usr/bin/env bash
# Downloads into .whl/ the wheels benchmarks/gpu_check.py needs on a GPU machine that has
# no package index but has PyTorch, CUDA, NVRTC, cuda-python, llvmlite, onnx and pytest
# (Python 3.12, x86-64): islpy, whose isl polyfuse's scheduler uses, and llvmlite 0.50
# (LLVM 22), the version polyfuse's code generators are tested with (the machine's may be
# older, for its numba). About 60 MiB: .whl/ is ignored by git; carry it to the GPU
# machine with the working tree (the carry limit is 64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PYTHON_VERSION:-3.12}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl islpy llvmlite==0.50.0
ls -l .whl
