#!/usr/bin/env bash
# One call for stop 53's verify-step changes: the CUDA tests of the chain and the MTP round
# (a round goes ahead only where no outcome pauses its row) and of the GEMV launch; the 35B-A3B
# fp8-row verify step (3 oracle drafts) on this tree and on OLD's (carried; before the
# several-row GEMVs took whole-K programs), the MTP step and the decode step; then `ninfer
# bench`'s speculative section at B=1 and 8 (the policy timing a step gone ahead from the step
# before's settling).
#   OUT=/tmp/o OLD=.peers/old53 bash bench/verify_gemv_device.sh
source bench/device_env.sh
gpu_tests 150 tests/engine/test_mtp_round.py tests/engine/test_verify_chain.py \
  tests/engine/test_verify_chain_engine.py \
  tests/kernels/test_dequant_gemv_fusions.py tests/kernels/test_dequant_gemv.py \
  tests/engine/test_verify_step_syncs.py
profile_step verify --spec 3
[ -n "$OLD" ] && TREE=$PWD/$OLD profile_step verify-old --spec 3
profile_step mtp-ahead --spec 3 --drafter mtp
[ "$(left)" -gt 100 ] && PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u \
  -m ninfer_engine.cli.tools bench --arch 35b-a3b --weights fp8-row --context 1024 \
  --concurrency 1,8 --prefill 0 --draft-tokens 3 --spec-rates 3.67,2.4 --spec-batch 1,8 \
  --no-peer --out "$OUT/r/bench-spec.json" > "$OUT/r/bench-spec.log" 2>&1
grep -E "^\| [18] \| 1024 \|" "$OUT/r/bench-spec.log" || tail -5 "$OUT/r/bench-spec.log"
echo "done at $SECONDS s"
pack_results
