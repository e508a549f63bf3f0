#!/usr/bin/env bash
# The test suite's GPU half on a device machine: every test folder whose tests take
# NINFER_TEST_DEVICE=cuda (or are CUDA-only), 12 workers, the CPU-only folders left out (CI runs
# them). Run from the repository root with OUT set; `.whl/` holds the wheels the machine lacks
# (`bash scripts/device_wheels.sh` makes it). A fresh machine compiles every Triton kernel on
# first use: give the call ≥ 300 s (175 s cut one off at 82 %).
#   OUT=/tmp/o bash bench/cuda_suite.sh [pytest args, e.g. -k paged]
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 && export PYTHONPATH=$PWD:/tmp/site
OUT=${OUT:-/tmp}
NINFER_TEST_DEVICE=cuda timeout "${SUITE_S:-290}" python3 -m pytest -q -n 12 --dist load \
  -m "not slow" -p no:cacheprovider -p no:benchmark --timeout 150 -rfE --tb=short \
  tests/engine tests/models tests/kernels tests/kv tests/parallel tests/experts tests/vision \
  tests/artifact/test_fp8_nvfp4.py tests/http/test_vision_live.py tests/serve/test_profiles_gpu.py \
  tests/serve/test_engine_process_serve.py "$@" > "$OUT/cuda-suite.txt" 2>&1
rc=$?
echo "cuda suite rc=$rc: $(tail -1 "$OUT/cuda-suite.txt")"
grep -E "^(FAILED|ERROR)" "$OUT/cuda-suite.txt" | head -20
exit $rc
