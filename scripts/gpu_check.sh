#!/usr/bin/env bash
# GPU check of the cupy backend: the whole test suite with cupy required (a skip of a cupy
# test fails; every backend-parametrised test then runs on CuPy arrays), then the benchmark.
# Installs nothing: run it where entmax-ref[cuda,test] is installed.  Each step has its own
# timeout; the suite's duration on a GPU machine has not been measured since it became whole.
set -euo pipefail
cd "$(dirname "$0")/.."
python -c "import cupy; assert cupy.is_available(), 'no CUDA device'; print('cupy', cupy.__version__)"
echo "== the test suite, cupy required =="
ENTMAX_REF_REQUIRE_BACKENDS=cupy timeout 900 python -m pytest -q -p no:cacheprovider -x tests/
echo "== GPU benchmark =="
timeout 200 python scripts/gpu_bench.py --budget 120
