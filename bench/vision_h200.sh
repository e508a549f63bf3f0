#!/usr/bin/env bash
# The vision work on one H200, in one device call (about 5 minutes):
#   1. bench/vision_encoder.py: the 27B-shape tower on one 1024x1024 image beside transformers'
#      encoder, and the served engine's TTFT with it -> $OUT/h200-vision-encoder.{json,md};
#   2. the media path's tests on CUDA: the engine and live server against transformers on the
#      exact fp32 path (tests/vision, tests/http/test_vision_live.py), the graph step's rotary
#      shift and decode stack on the real kernels, the hybrid graph/verify tests (whose
#      stand-in sequences now carry a rope delta), the video path against transformers' video
#      processor (torchvision) -> $OUT/vision-cuda-tests.txt;
#   3. bf16 with decode CUDA graphs and media against transformers' fp32, its measured errors
#      printed -> $OUT/vision-bf16-graphs.txt.
# Needs torch with CUDA, triton, transformers, torchvision, Pillow and PyAV (`av`) importable;
# PyAV wheels under .whl/ are installed to /tmp/site first (the H200 image has no PyAV). Run
# from the repository root.
set -u
OUT=${OUT:-bench/results}
PY=${PYTHON:-python3}
export NINFER_TEST_DEVICE=${NINFER_TEST_DEVICE:-cuda}  # the device fixture's tests on the GPU
mkdir -p "$OUT"
if ls .whl/av-*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/av-*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" bench/vision_encoder.py --out "$OUT" || echo "vision_encoder.py failed: $?" >&2
"$PY" -m pytest -q -m "not slow" -p no:cacheprovider tests/vision tests/http/test_vision_live.py \
    tests/kernels/test_decode_rope_shift.py tests/kernels/test_decode_stack.py \
    tests/engine/test_hybrid_graphs.py tests/engine/test_hybrid_verify.py \
    --deselect tests/vision/test_bf16_graphs_vs_fp32.py > "$OUT/vision-cuda-tests.txt" 2>&1
echo "tests exit $?: $(tail -1 "$OUT/vision-cuda-tests.txt")"
"$PY" -m pytest -q -s -m gpu -p no:cacheprovider tests/vision/test_bf16_graphs_vs_fp32.py \
    > "$OUT/vision-bf16-graphs.txt" 2>&1
echo "bf16 graphs exit $?: $(tail -1 "$OUT/vision-bf16-graphs.txt")"
