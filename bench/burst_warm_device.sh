#!/usr/bin/env bash
# One call for what stops 53 and 54 left unmeasured: the warm-up checks (each in a fresh
# process: the paged prefill's one-chunk launches now warmed), the chain's engine tests and the
# MTP round's (a media row's rotary shift in the captured round); issue 18's TTFT burst with the
# gather window counted from the newest arrival, and now held while rows decode
# (bench/ttft_burst_device.sh; the engine process's log lines reach serve.log: warm-up,
# captures, compiles in traffic); the 35B-A3B fp8-row step at B=1: decode, the oracle verify
# step (issue 18's ratio), the MTP round greedy and over --lm-head-draft's shortlist, now fp8-row
# codes beside the fp8-row head (profile_step says which head the captured round argmaxes over);
# stop 56's step-failure containment and stop 55's DFlash media test on CUDA.
#   OUT=/tmp/o bash bench/burst_warm_device.sh
source bench/device_env.sh
gpu_tests 170 tests/engine/test_warm_up.py tests/engine/test_fresh_process.py \
  tests/engine/test_verify_chain.py tests/engine/test_verify_chain_engine.py \
  tests/engine/test_mtp_round.py tests/engine/test_arrival_window.py \
  tests/engine/test_mtp_speculation.py tests/vision/test_mtp_media.py \
  tests/engine/test_step_failure.py tests/vision/test_dflash_media.py
timeout 240 bash bench/ttft_burst_device.sh
pkill -9 -f ninfer_tui.cli 2>/dev/null  # a server the timeout left behind
profile_step decode --spec 0
profile_step verify --spec 3
profile_step mtp-ahead --spec 3 --drafter mtp
profile_step mtp-shortlist --spec 3 --drafter mtp --lm-head-draft 131072
grep -h "draft round over" "$OUT"/r/step-mtp-*.log
echo "done at $SECONDS s"
pack_results
