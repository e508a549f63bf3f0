#!/usr/bin/env bash
# The grouped expert GEMMs' launch order (`kernels.moe_grouped`: column tiles of one row tile
# side by side, the grid's fast axis) against the tree before it (OLD=dir, carried: row tiles
# fastest), in one call: the kernels' CUDA tests, each GEMM alone at its e4m3-activation tiles
# (bench/moe_grouped_bench.py --fp8-tiles, 955/4,096/7,640 tokens of the 35B-A3B layer), the
# engine's 8-layer 35B-A3B prompt bursts (bench/prompt_burst.py, 8 × 955 profiled), then the
# 8K prefill of the 35B-A3B and 27B fp8-row shapes (`ninfer bench --prefill 8192`), each tree
# in turn.
#   git archive <before> ninfer_engine bench | tar -x -C .old   (ignored; carry .old, .old-fp8)
#   OUT=/tmp/o OLD=.old FP8_OLD=.old-fp8 bash bench/moe_order_device.sh
source bench/device_env.sh
gpu_tests 150 tests/kernels/test_moe_grouped.py tests/kernels/test_moe_grouped_fp8_act.py \
  tests/models/test_moe_dispatch.py
TILES=${TILES:-128x64x128w4s3,128x128x128w4s3,128x128x128w8s3,128x128x128w8s4,128x256x128w8s3,64x64x128w4s3,64x128x128w4s3,64x128x128w8s3}
trees="new${OLD:+ old}"
for tag in $trees; do
  R=$PWD; [ "$tag" = old ] && R=$(cd "$OLD" && pwd)
  PYTHONPATH=$R:/tmp/site timeout "$(left)" python3 -P "$R/bench/moe_grouped_bench.py" \
    --tokens 955,4096,7640 --block-m 64 --fp8-tiles "$TILES" --json "$OUT/r/moe-$tag.json" \
    > "$OUT/r/moe-$tag.log" 2>&1
  echo "moe $tag:"; grep -E "fastest|fp8_act" "$OUT/r/moe-$tag.log" | head -12
done
for tag in $trees; do
  [ "$(left)" -gt 90 ] || break
  R=$PWD; [ "$tag" = old ] && R=$(cd "$OLD" && pwd)
  PYTHONPATH=$R:/tmp/site timeout "$(left)" python3 -P -u "$R/bench/prompt_burst.py" \
    --layers 8 --bursts 1x955,8x955,8x955,8x955 --profile 8x955 \
    --json "$OUT/r/burst-$tag.json" > "$OUT/r/burst-$tag.log" 2>&1
  echo "burst $tag:"; grep -E "^[0-9]+x|kernel" "$OUT/r/burst-$tag.log" | head -8
done
# FP8_OLD=dir (carried): the tree before `--prefill-activations fp8` reached the projections
# (eafdb61), whose 8K prefill the last call ran as this tree by mistake (`python3 -m` put the
# working directory's tree first on sys.path: -P now keeps it off)
prefill_bench new "$PWD" 35b-a3b
[ -n "${OLD:-}" ] && prefill_bench old "$(cd "$OLD" && pwd)" 35b-a3b
prefill_bench new "$PWD" 27b
[ -n "${FP8_OLD:-}" ] && prefill_bench pre-fp8 "$(cd "$FP8_OLD" && pwd)" 27b
[ -n "${FP8_OLD:-}" ] && prefill_bench pre-fp8 "$(cd "$FP8_OLD" && pwd)" 35b-a3b
pack_results
