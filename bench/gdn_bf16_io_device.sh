#!/usr/bin/env bash
# A prompt step's GDN q, k, v and walk output in bf16 (this tree) against fp32 (the carried tree
# OLD, default .old: `git archive <commit> ninfer_engine bench | tar -x -C .old`), in one call:
# the GDN kernels' and the hybrid prompt paths' CUDA tests, then the engine's 8-layer 35B-A3B
# prompt bursts (bench/prompt_burst.py --prefill-chunk 8192: 8 × 955 in one step) from each
# tree in turn, the first round with the 8x955 burst profiled (its kernel table), while time
# is left.
#   OUT=/tmp/o [OLD=.old] bash bench/gdn_bf16_io_device.sh
source bench/device_env.sh
OLD=${OLD:-.old}
gpu_tests 150 tests/kernels/test_gdn_chunk.py tests/kernels/test_gdn_prompt.py \
  tests/kernels/test_gdn_split.py tests/engine/test_prompt_graphs.py \
  tests/engine/test_hybrid_graphs.py
for round in 1 2 3; do
  for tree in "$OLD" .; do
    [ "$(left)" -gt 60 ] || break 2
    tag=$([ "$tree" = . ] && echo new || echo old)
    L=$OUT/r/burst-$round-$tag.log
    extra=()
    [ "$round" = 1 ] && extra=(--profile 8x955)
    PYTHONPATH=$tree:/tmp/site timeout "$(( $(left) - 10 ))" python3 -P -u \
      "$tree/bench/prompt_burst.py" --layers 8 --bursts 1x955,8x955,8x955,8x955,1x955 \
      --prefill-chunk 8192 "${extra[@]}" --json "$OUT/r/burst-$round-$tag.json" > "$L" 2>&1
    echo "round $round $tag: $(grep -E '^(1|8)x955' "$L" | sed 's/.*steps//' | tr '\n' ' ')"
  done
done
echo "done at $SECONDS s"
pack_results
