#!/usr/bin/env bash
# One device call: kernel tests on real Triton, then the kernel and decode benchmarks.
# Results and logs go to $OUT (default bench/results); copy the JSON into bench/results/.
set -o pipefail
OUT=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
  --format=csv > "$OUT/nvidia-smi.csv" 2>&1
timeout 90 python3 -m pytest tests/kernels -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log"
timeout 160 python3 bench/gpu_kernels.py --out "$OUT/h200-kernels.json" 2>&1 | tee "$OUT/kernels.log"
timeout 210 python3 bench/gpu_decode.py --moe --out "$OUT/h200-decode.json" 2>&1 \
  | tee "$OUT/decode.log"
