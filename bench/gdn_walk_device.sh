#!/usr/bin/env bash
# A prompt step's kernels of this tree against the engine's before, in one call (~9 minutes of a
# fresh H200): the GDN and grouped-expert kernel tests on CUDA (the split walk in TF32 at the
# models' head size among them, the gated norm now shared with its output, the expert GEMMs
# with the model's dims compile-time); one layer's GDN prompt launches by variant, the split
# path's three (its output with the gated norm) beside the engine's precompute, walk and norm
# (`gdn_prompt_parts.py`); the expert GEMMs' e4m3 tiles (`moe_grouped_bench.py --fp8-tiles`);
# then the engine's prompt step, eight 1K prompts at once and one 8K
# prompt on the 8-layer 35B-A3B fp8-row shape, in turn: this tree with the engine's walk, with
# the split walk (`--gdn-walk split`) and, with OLD set to an older tree's checkout (carried),
# that tree (issue 18's TTFT target: the 7,632-token step is ~30 ms, GDN ~10 of it, the
# experts' GEMMs ~8). Run from the repository root with OUT set; `.whl/` from
# `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o [OLD=.peers/old48] bash bench/gdn_walk_device.sh   (old48: git archive d3e77a3)
source bench/device_env.sh
gpu_tests 120 tests/kernels/test_gdn_split.py tests/kernels/test_gdn_chunk.py \
  tests/kernels/test_gdn_fused.py tests/kernels/test_gdn_prep.py tests/kernels/test_gdn_prompt.py \
  tests/models/test_gdn_rows.py tests/kernels/test_moe_grouped.py \
  tests/kernels/test_moe_grouped_fp8_act.py
PYTHONPATH=$PWD:/tmp/site timeout 240 python3 -u bench/gdn_prompt_parts.py --engine-first \
  --out "$OUT/r" \
  > "$OUT/r/parts.log" 2>&1
echo "parts at $SECONDS s:"; grep -E "^\|" "$OUT/r/parts.log" | tail -28
# the expert GEMMs' e4m3 tiles again, now that H and I are compile-time (LAUNCH_FP8's first)
PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -u bench/moe_grouped_bench.py --tokens 955,7640 \
  --fp8-tiles 64x64x128w4s3,64x64x128w8s3,128x64x128w4s3,128x64x128w8s3,128x64x64w4s3,\
128x64x64w8s3,128x128x64w8s3,128x128x128w8s3 --json "$OUT/r/moe-tiles.json" \
  > "$OUT/r/moe-tiles.log" 2>&1
echo "expert tiles at $SECONDS s:"; tail -2 "$OUT/r/moe-tiles.log" | cut -c1-1500
runs="chunk split${OLD:+ old}"
for round in 1 2; do
  for run in $runs; do
    [ "$(left)" -gt 60 ] || break 2
    R=$PWD walk=$run
    [ "$run" = old ] && R=$PWD/$OLD walk=chunk
    extra=()
    [ "$run" = old ] || extra=(--gdn-walk "$walk")  # the older tree has no such flag
    PYTHONPATH=$R:/tmp/site timeout "$(left)" python3 -u "$R/bench/prompt_burst.py" --layers 8 \
      --bursts 1x955,8x955,8x955,8x955,1x8000 "${extra[@]}" \
      --json "$OUT/r/burst-$round-$run.json" > "$OUT/r/burst-$round-$run.log" 2>&1
    echo "burst $round, $run:"; grep -E "^[0-9]+x" "$OUT/r/burst-$round-$run.log"
  done
done
echo "done at $SECONDS s"
pack_results
