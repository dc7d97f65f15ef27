#!/usr/bin/env bash
# The first GPU run of the cupy backend, one command under 8 minutes on one H100 or H200,
# that writes one JSON of results, gpu_check.json (in $OUT when it is set, else here), in
# three steps, each with its own time limit (scripts/gpu_bench.py: what each field holds):
#   1. every kernel compiled by NVRTC (the time it takes; CuPy's disk cache then holds them);
#   2. the GPU tests: tests/test_cupy_backend.py and every backend-parametrised test of the
#      suite on CuPy arrays (-m cuda), with cupy required (a skip of one fails), reported as
#      JUnit XML (gpu_tests.xml beside the JSON) and folded into the JSON;
#   3. engine identity on the device and the attention bench against torch SDPA and, where
#      importable, AdaSplash.
# The exit status is 0 when the JSON's "problems" is empty (no part failed, no GPU test
# failed, every row has the CPU's support).
# Installs nothing and fetches nothing: it runs from this checkout (PYTHONPATH) with the
# machine's python3, which must hold numpy, numba, scipy, cupy, pytest (and torch for the
# SDPA baseline).  Wheels of packages the machine lacks can travel in .whl/ (ignored by
# git): they are unpacked into /tmp/site first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR="${OUT:-.}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# a cache folder of its own, and no ahead-of-time compile of the numba kernels (the CPU
# reference of these runs is the NumPy engine)
export ENTMAX_REF_CACHE_DIR="${ENTMAX_REF_CACHE_DIR:-/tmp/entmax-ref-cache}" ENTMAX_REF_TEST_PRECOMPILE=0
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 -c "import cupy; assert cupy.is_available(), 'no CUDA device'; print('cupy', cupy.__version__)" || exit 1
echo "== compile every kernel =="
timeout 150 python3 scripts/gpu_bench.py --parts compile --json "$OUTDIR/gpu_check.json"
echo "== GPU tests (cupy required) =="
# (SIGINT at the limit: pytest stops and still writes the report of the tests it ran)
timeout -s INT -k 15 180 python3 -m pytest -q -p no:cacheprovider -n 0 -m cuda --require-backends cupy \
    --continue-on-collection-errors --junitxml "$OUTDIR/gpu_tests.xml" tests/
echo "== engine identity and the attention bench =="
timeout 120 python3 scripts/gpu_bench.py --parts identity,bench --budget 50 --json "$OUTDIR/gpu_check.json" \
    --tests "$OUTDIR/gpu_tests.xml"
