#!/usr/bin/env bash
# `--spec` with the lookahead step under it, in one call of a fresh H200: the CUDA tests of the
# graphed MTP round, the verify chain and the warm-up (each warm-up check in a fresh process),
# what the warm-up leaves to compile, then `ninfer bench`'s speculative section on the whole
# 35B-A3B fp8-row shape (B=1 and 8, context 1024) with MTP drafts and with oracle drafts: the
# "under the policy" column is the served path (plain steps go ahead, the policy drafts when
# verify steps have been faster).
#   OUT=/tmp/o bash bench/spec_lookahead_device.sh
source bench/device_env.sh
gpu_tests 200 tests/engine/test_mtp_round.py tests/engine/test_verify_chain.py \
  tests/engine/test_warm_up.py tests/engine/test_fresh_process.py \
  tests/engine/test_lookahead_gpu.py tests/engine/test_verify_step_syncs.py
PYTHONPATH=$PWD:/tmp/site timeout 90 python3 -u bench/warm_up_compiles.py \
  > "$OUT/r/compiles.log" 2>&1
grep -vE "^(WARNING|Triton compiled)" "$OUT/r/compiles.log" | cut -c1-300 | head -12
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
