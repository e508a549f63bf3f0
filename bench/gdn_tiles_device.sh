#!/usr/bin/env bash
# The GDN prompt precompute's tiles in bf16 against fp32 (`gdn_chunk`'s `tiles_dtype`), in one
# call: the GDN kernels' CUDA tests (the bf16 tiles' first GPU run), one layer's GDN launches
# with every launch variant (bench/gdn_prompt_parts.py: prep and walk over both tile dtypes,
# the walk's 128 value columns and 2 stages), then the engine's 8-layer 35B-A3B prompt bursts
# (bench/prompt_burst.py --prefill-chunk 8192: 8 × 955 in one step) with --gdn-tiles fp32 and
# bf16 in turn, twice.
#   OUT=/tmp/o bash bench/gdn_tiles_device.sh
source bench/device_env.sh
gpu_tests 150 tests/kernels/test_gdn_chunk.py tests/kernels/test_gdn_prep.py \
  tests/kernels/test_gdn_split.py
PYTHONPATH=$PWD:/tmp/site timeout 240 python3 -P bench/gdn_prompt_parts.py --out "$OUT/r" \
  > "$OUT/r/parts.log" 2>&1
echo "parts: $(grep -c ' ms ' "$OUT/r/parts.log") variants timed at $SECONDS s"
for round in 1 2; do
  for tiles in fp32 bf16; do
    [ "$(left)" -gt 50 ] || break 2
    L=$OUT/r/burst-$round-$tiles.log
    PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -P -u bench/prompt_burst.py --layers 8 \
      --bursts 1x955,8x955,8x955,8x955 --prefill-chunk 8192 --gdn-tiles $tiles \
      --json "$OUT/r/burst-$round-$tiles.json" > "$L" 2>&1
    echo "burst $round $tiles: $(grep -E '^(1|8)x955' "$L" | sed 's/.*steps//' | tr '\n' ' ')"
  done
done
echo "done at $SECONDS s"
pack_results
