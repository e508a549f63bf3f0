#!/usr/bin/env bash
# `--spec` with the lookahead step under it, in one call of a fresh H200: the CUDA tests of the
# graphed MTP round, the verify chain and the warm-up (each warm-up check in a fresh process),
# what the warm-up leaves to compile, the B=1 MTP step with the whole head and with
# --lm-head-draft's shortlist (131,072 rows, the real artifacts'), then `ninfer bench`'s
# speculative section on the whole 35B-A3B fp8-row shape (B=1 and 8, context 1024) with MTP drafts and with oracle drafts: the
# "under the policy" column is the served path (plain steps go ahead, the policy drafts when
# verify steps have been faster).
#   OUT=/tmp/o bash bench/spec_lookahead_device.sh
source bench/device_env.sh
gpu_tests 170 tests/engine/test_mtp_round.py tests/engine/test_verify_chain.py \
  tests/engine/test_warm_up.py tests/engine/test_fresh_process.py \
  tests/engine/test_lookahead_gpu.py tests/engine/test_verify_step_syncs.py
PYTHONPATH=$PWD:/tmp/site timeout 90 python3 -u bench/warm_up_compiles.py \
  > "$OUT/r/compiles.log" 2>&1
grep -vE "^(WARNING|Triton compiled)" "$OUT/r/compiles.log" | cut -c1-300 | head -12
step() {  # name, profile_step arguments...: the MTP round at B=1, its head whole or a shortlist
  local name=$1
  shift
  [ "$(left)" -gt 120 ] || return 0
  PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u bench/profile_step.py --arch 35b-a3b \
    --weights fp8-row --spec 3 --drafter mtp "$@" > "$OUT/r/step-$name.log" 2>&1
  echo "$name: $(grep -E 'engine step|tokens a round|graph alone' "$OUT/r/step-$name.log" \
    | tr '\n' ' ')"
  grep -E "Error|error" "$OUT/r/step-$name.log" | tail -3
}
step mtp-ahead
step mtp-shortlist --lm-head-draft 131072
for drafter in mtp oracle; do
  [ "$(left)" -gt 90 ] || break
  PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u -m ninfer_engine.cli.tools bench \
    --arch 35b-a3b --weights fp8-row --context 1024 --concurrency 1,8 --prefill 0 \
    --draft-tokens 3 --spec-rates 3.67,2.4 --spec-batch 1,8 --spec-drafter $drafter --no-peer \
    --out "$OUT/r/bench-$drafter.json" > "$OUT/r/bench-$drafter.log" 2>&1
  echo "$drafter:"; grep -E "^\| [18] \| 1024 \| 3 " "$OUT/r/bench-$drafter.log" \
    || tail -5 "$OUT/r/bench-$drafter.log"
done
echo "done at $SECONDS s"
