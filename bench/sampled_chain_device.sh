#!/usr/bin/env bash
# The verify chain's sampled rows on a fresh H200: the CUDA tests of the chain and the MTP
# round (captured graphs), then the 35B-A3B fp8-row step at B=1 with MTP drafts (3.67 tokens
# a round forced) greedy, and sampled as the model preset samples (top_k 20) through the
# chain and through the host's acceptance (--verify-chain off), then the oracle verify step.
#   OUT=/tmp/o bash bench/sampled_chain_device.sh
source bench/device_env.sh
gpu_tests 170 tests/engine/test_verify_chain.py tests/engine/test_mtp_round.py \
  tests/engine/test_verify_step_syncs.py
step() {  # name, profile_step arguments...
  local name=$1
  shift
  [ "$(left)" -gt 60 ] || return 0
  PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u bench/profile_step.py --arch 35b-a3b \
    --weights fp8-row "$@" > "$OUT/r/step-$name.log" 2>&1
  echo "$name: $(grep -E 'engine step|tokens a round|graph alone|chained rounds|^sampling' \
    "$OUT/r/step-$name.log" | tr '\n' ' ')"
  grep -E "Error|error" "$OUT/r/step-$name.log" | tail -3
}
step mtp-greedy --spec 3 --drafter mtp
step mtp-preset --spec 3 --drafter mtp --sampling preset
step mtp-preset-host --spec 3 --drafter mtp --sampling preset --verify-chain off
step decode
step oracle --spec 3
echo "done at $SECONDS s"
