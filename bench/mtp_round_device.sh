#!/usr/bin/env bash
# MTP drafting after its SDPA runs without cuDNN, in one short call (~3 minutes of a fresh
# H200): the MTP sync test on the served dtype, the warm-up tests and the trailing mask's on
# CUDA; which Triton variants still compile after the warm-up (`warm_up_compiles.py`); the
# verify step drafted by the MTP head on the whole 35B-A3B fp8-row shape at B=1 (85 ms a
# step with cuDNN's per-length plans in draft steps of one query, 4.07 ms for oracle drafts);
# the first prompt bursts after a warm-up on a cold Triton cache (8-layer 35B-A3B).
# Run from the repository root with OUT set; `.whl/` from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o bash bench/mtp_round_device.sh
source bench/device_env.sh
gpu_tests 100 tests/engine/test_mtp_draft_syncs.py tests/engine/test_warm_up.py \
  tests/models/test_trailing_mask.py tests/models/test_mtp.py
PYTHONPATH=$PWD:/tmp/site timeout 90 python3 -u bench/warm_up_compiles.py \
  > "$OUT/r/compiles.log" 2>&1
grep -vE "^(WARNING|Triton compiled)" "$OUT/r/compiles.log" | cut -c1-700 | head -30
PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u bench/profile_step.py --arch 35b-a3b \
  --weights fp8-row --spec 3 --drafter mtp > "$OUT/r/step-mtp.log" 2>&1
echo "mtp: $(grep -E 'engine step|tokens a round' "$OUT/r/step-mtp.log")"
# a fresh machine's cold Triton cache: does the first burst still compile in traffic?
[ "$(left)" -gt 40 ] && PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u \
  bench/prompt_burst.py --layers 8 --bursts 1x955,8x955,8x955 --json "$OUT/r/burst.json" \
  > "$OUT/r/burst.log" 2>&1
grep -E "^[0-9]+x|compiles after" "$OUT/r/burst.log"; grep -A4 "compiles after" "$OUT/r/burst.log" | cut -c1-120
echo "done at $SECONDS s"
pack_results
