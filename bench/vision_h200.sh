#!/usr/bin/env bash
# The vision work on one H200, in one device call (about 5 minutes):
#   1. bench/vision_encoder.py: the 27B-shape tower on one 1024x1024 image beside transformers'
#      encoder, and the served engine's TTFT with it -> $OUT/h200-vision-encoder.{json,md};
#   2. the media path's tests on CUDA: the engine and live server against transformers on the
#      exact fp32 path (tests/vision, tests/http/test_vision_live.py), the graph step's rotary
#      shift and decode stack on the real kernels, the hybrid graph/verify tests (whose
#      stand-in sequences now carry a rope delta) -> $OUT/vision-cuda-tests.txt.
# Needs torch with CUDA, triton, transformers, Pillow and PyAV (`av`) importable. Run from the
# repository root.
set -u
OUT=${OUT:-bench/results}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
"$PY" bench/vision_encoder.py --out "$OUT" || echo "vision_encoder.py failed: $?" >&2
"$PY" -m pytest -q -m "not slow" -p no:cacheprovider tests/vision tests/http/test_vision_live.py \
    tests/kernels/test_decode_rope_shift.py tests/kernels/test_decode_stack.py \
    tests/engine/test_hybrid_graphs.py tests/engine/test_hybrid_verify.py \
    > "$OUT/vision-cuda-tests.txt" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/vision-cuda-tests.txt")"
