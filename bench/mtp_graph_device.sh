#!/usr/bin/env bash
# `--spec mtp` with its draft round captured as a CUDA graph (`step.mtp_round`), in one call of
# a fresh H200: the CUDA tests of the round, MTP drafting and the warm-up; then the 35B-A3B
# fp8-row engine step at B=1 with MTP drafts (13.2 ms eager, h200-verify-round.md), oracle
# drafts and plain decode side by side; then what the warm-up leaves to compile and the first
# bursts on a cold cache (the rest of mtp_round_device.sh). The MTP step runs twice: with the
# verify chain (acceptance and the next drafts on the device, `step.verify_chain`), each round
# launched before the one before is read (`step.chain_ahead`) and not, and without the chain;
# and ahead with the served preset's penalties (`step.chain_penalties`).
#   OUT=/tmp/o bash bench/mtp_graph_device.sh
source bench/device_env.sh
gpu_tests 150 tests/engine/test_mtp_round.py tests/engine/test_mtp_draft_syncs.py \
  tests/engine/test_mtp_speculation.py tests/engine/test_mtp_prefix_reuse.py \
  tests/engine/test_hybrid_verify.py tests/engine/test_verify_chain.py \
  tests/engine/test_verify_chain_engine.py \
  tests/engine/test_verify_step_syncs.py \
  tests/engine/test_warm_up.py tests/models/test_mtp.py
# most wanted first: a short call (BUDGET) cuts the last
profile_step mtp-ahead --spec 3 --drafter mtp
profile_step mtp-host --spec 3 --drafter mtp --verify-chain off
profile_step mtp-served --spec 3 --drafter mtp --sampling served
profile_step decode
profile_step oracle --spec 3
profile_step mtp-chain --spec 3 --drafter mtp --verify-chain on
PYTHONPATH=$PWD:/tmp/site timeout 90 python3 -u bench/warm_up_compiles.py \
  > "$OUT/r/compiles.log" 2>&1
grep -vE "^(WARNING|Triton compiled)" "$OUT/r/compiles.log" | cut -c1-400 | head -20
[ "$(left)" -gt 60 ] && PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u \
  bench/prompt_burst.py --layers 8 --bursts 1x955,8x955,8x955 --json "$OUT/r/burst.json" \
  > "$OUT/r/burst.log" 2>&1
grep -E "^[0-9]+x|compiles after" "$OUT/r/burst.log"; grep -A4 "compiles after" "$OUT/r/burst.log" | cut -c1-120
echo "done at $SECONDS s"
pack_results
