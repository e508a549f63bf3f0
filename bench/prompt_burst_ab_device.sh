#!/usr/bin/env bash
# The engine's prompt step from several trees in one call: the CUDA tests of the prompt step's
# kernels (GDN prologue, precompute, walk; the MoE's grouped GEMMs and slot sum; the hybrid
# prompt paths), then the 8-layer 35B-A3B prompt bursts (bench/prompt_burst.py --prefill-chunk
# 8192: 8 × 955 in one step) from each of TREES in turn (carried trees: `git archive <commit>
# ninfer_engine bench | tar -x -C .old`; `.` is this one), the first round with the 8x955 burst
# profiled (its kernel table), ROUNDS rounds (default 3) while time is left. EXTRA_TESTS: more
# test files for the same pytest run.
#   OUT=/tmp/o TREES=".old .mid ." [ROUNDS=1] [EXTRA_TESTS="…"] bash bench/prompt_burst_ab_device.sh
source bench/device_env.sh
TREES=${TREES:-.old .}
gpu_tests "${TESTS_S:-150}" tests/kernels/test_gdn_chunk.py tests/kernels/test_gdn_prompt.py \
  tests/kernels/test_gdn_split.py tests/kernels/test_slot_sum.py tests/kernels/test_moe_grouped.py \
  tests/kernels/test_moe_grouped_fp8_act.py tests/engine/test_prompt_graphs.py \
  tests/engine/test_hybrid_graphs.py $EXTRA_TESTS
for round in $(seq "${ROUNDS:-3}"); do
  for tree in $TREES; do
    [ "$(left)" -gt 60 ] || break 2
    tag=$([ "$tree" = . ] && echo new || basename "$tree" | tr -d .)
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
