#!/usr/bin/env bash
# The split GDN walk (`kernels.gdn_split`) against the engine's, in one call (~8 minutes of a
# fresh H200): the GDN kernel tests on CUDA (the split walk in TF32 at the models' head size
# among them, and the gated norm now shared with its output); one layer's prompt-step launches
# by variant, the split path's three (its output with the gated norm) beside the engine's
# precompute, walk and norm (`gdn_prompt_parts.py`); then the engine's prompt step, eight 1K
# prompts at once on the 8-layer 35B-A3B fp8-row shape, with each walk in turn, two processes
# each (issue 18's TTFT target: the 7,632-token step is ~30 ms, GDN ~10 of it). Run from the
# repository root with OUT set; `.whl/` from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o bash bench/gdn_walk_device.sh
source bench/device_env.sh
gpu_tests 120 tests/kernels/test_gdn_split.py tests/kernels/test_gdn_chunk.py tests/kernels/test_gdn_fused.py \
  tests/kernels/test_gdn_prep.py tests/kernels/test_gdn_prompt.py tests/models/test_gdn_rows.py
PYTHONPATH=$PWD:/tmp/site timeout 240 python3 -u bench/gdn_prompt_parts.py --out "$OUT/r" \
  > "$OUT/r/parts.log" 2>&1
echo "parts at $SECONDS s:"; grep -E "^\|" "$OUT/r/parts.log" | tail -28
for walk in chunk split chunk split; do
  [ "$(left)" -gt 60 ] || break
  n=$((n + 1))
  PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u bench/prompt_burst.py --layers 8 \
    --bursts 1x955,8x955,8x955,8x955,1x8000 --gdn-walk $walk \
    --json "$OUT/r/burst-$n-$walk.json" > "$OUT/r/burst-$n-$walk.log" 2>&1
  echo "burst $n, $walk walk:"; grep -E "^[0-9]+x" "$OUT/r/burst-$n-$walk.log"
done
echo "done at $SECONDS s"
