#!/usr/bin/env bash
# GPU check of the cupy backend: the GPU tests with the backend required (a skip fails),
# then the benchmark.  Installs nothing: run it where entmax-ref[cuda,test] is installed.
# Finishes in under 8 minutes on an A100/H100-class GPU (each step has its own timeout).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import cupy; assert cupy.is_available(), 'no CUDA device'; print('cupy', cupy.__version__)"
echo "== GPU tests (cupy required) =="
timeout 240 python -m pytest -q -p no:cacheprovider --require-backends cupy \
    tests/test_cupy_backend.py tests/test_cuda_core.py
echo "== GPU benchmark =="
timeout 200 python scripts/gpu_bench.py --budget 120
