#!/usr/bin/env bash
# One call of a fresh H200 for what stops 51-52 built: the CUDA tests of the graphed MTP round
# (with --lm-head-draft's shortlist), the verify chain (greedy, penalized and sampled rows),
# the lookahead step and the warm-up (each warm-up check in a fresh process); issue 18's TTFT
# of 1K-token prompts one at a time and eight together (bench/ttft_burst_device.sh); then the
# 35B-A3B fp8-row step at B=1 with MTP drafts (3.67 tokens a round forced): greedy, sampled as
# the preset samples (top_k 20) through the chain and through the host's acceptance, and
# greedy over --lm-head-draft's shortlist (131,072 rows, the real artifacts').
#   OUT=/tmp/o bash bench/spec_lookahead_device.sh
source bench/device_env.sh
gpu_tests 170 tests/engine/test_mtp_round.py tests/engine/test_verify_chain.py \
  tests/engine/test_verify_chain_engine.py \
  tests/engine/test_warm_up.py tests/engine/test_fresh_process.py \
  tests/engine/test_lookahead_gpu.py tests/engine/test_verify_step_syncs.py
timeout 240 bash bench/ttft_burst_device.sh
pkill -9 -f ninfer_tui.cli 2>/dev/null  # a server the timeout left behind
mtp() { profile_step "$1" --spec 3 --drafter mtp "${@:2}"; }
mtp mtp-ahead
mtp mtp-preset --sampling preset
mtp mtp-shortlist --lm-head-draft 131072
mtp mtp-preset-host --sampling preset --verify-chain off
echo "done at $SECONDS s"
pack_results
