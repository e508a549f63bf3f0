#!/usr/bin/env bash
# One device call that reproduces every H200 result file: the GPU test suite (Triton kernels,
# the static decoders, the hybrid engine numerics), the kernel sweep, the engine's decode step
# for both families, and `ninfer bench` (bench/h200_bench_all.sh). Results and logs go to $OUT;
# copy the JSON into bench/results/ (or run with OUT=bench/results).
# The transformers ≥ 5.24 wheel the tests and peers need is carried in .whl/ (git-ignored).
set -o pipefail
OUT=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
pip install -q --no-deps --target /tmp/tf .whl/transformers-*.whl >/dev/null 2>&1 \
  && export PYTHONPATH=/tmp/tf${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1
NINFER_TEST_DEVICE=cuda timeout 230 python3 -m pytest -q -p no:cacheprovider tests/kernels \
  tests/engine tests/models tests/benchmark > "$OUT/pytest-cuda.log" 2>&1
tail -5 "$OUT/pytest-cuda.log"
timeout 160 python3 bench/gpu_kernels.py --out "$OUT/h200-kernels.json" > "$OUT/kernels.log" 2>&1
timeout 200 python3 bench/gpu_engine_decode.py --peer --out "$OUT/h200-engine-decode.json" \
  > "$OUT/engine-decode.log" 2>&1
OUT=$OUT bash bench/h200_bench_all.sh
