#!/usr/bin/env bash
# MTP drafting's round on CUDA after its two fixes, in one call (~4 minutes of a fresh H200):
# the GPU tests of the drafting round's syncs, the trailing causal mask and the MTP and DFlash
# paths; the verify step drafted by the MTP head on the whole 35B-A3B fp8-row shape at B=1
# beside the oracle's (its step was 221 ms with cuDNN's SDPA building a plan at every new MTP
# KV length, against 4.1 ms for oracle drafts); then the prompt burst of 8 layers with the
# expert down GEMM's 128-row e4m3 tile of K 128 and the paged prefill's unsplit launches in
# the warm-up, this tree and OLD's in turn (the warm-up's new test against OLD's engine too: it
# should fail there). Run from the
# repository root with OUT set; `.whl/` from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o [OLD=.peers/old49] bash bench/mtp_draft_device.sh
source bench/device_env.sh
gpu_tests 120 tests/engine/test_mtp_draft_syncs.py tests/models/test_trailing_mask.py \
  tests/models/test_mtp.py tests/engine/test_mtp_speculation.py tests/engine/test_dflash_cuda.py \
  tests/engine/test_verify_step_syncs.py tests/kernels/test_moe_grouped_fp8_act.py \
  tests/models/test_moe_dispatch.py tests/engine/test_paged_prefill_wiring.py \
  tests/engine/test_warm_up.py
if [ -n "$OLD" ]; then
  PYTHONPATH=$PWD/$OLD:$PWD:/tmp/site timeout 60 python3 -m pytest -q -o addopts="" -p no:cacheprovider \
    tests/engine/test_warm_up.py -k long_prompts > "$OUT/r/warm-up-old.txt" 2>&1
  echo "the warm-up's burst test on OLD's engine: $(tail -1 "$OUT/r/warm-up-old.txt")"
fi
for drafter in mtp oracle; do
  [ "$(left)" -gt 60 ] || break
  PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u bench/profile_step.py --arch 35b-a3b \
    --weights fp8-row --spec 3 --drafter $drafter > "$OUT/r/step-$drafter.log" 2>&1
  echo "$drafter: $(grep -E 'engine step' "$OUT/r/step-$drafter.log")"
done
runs="new${OLD:+ old}"
for round in 1 2; do
  for run in $runs; do
    [ "$(left)" -gt 50 ] || break 2
    R=$PWD; [ "$run" = old ] && R=$PWD/$OLD
    PYTHONPATH=$R:/tmp/site timeout "$(left)" python3 -u "$R/bench/prompt_burst.py" --layers 8 \
      --bursts 1x955,8x955,8x955,1x8000,1x8000 --json "$OUT/r/burst-$round-$run.json" \
      > "$OUT/r/burst-$round-$run.log" 2>&1
    echo "burst $round, $run:"; grep -E "^[0-9]+x" "$OUT/r/burst-$round-$run.log"
  done
done
echo "done at $SECONDS s"
