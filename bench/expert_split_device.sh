#!/usr/bin/env bash
# Issue 20's table under the per-step split, in one call (~9 minutes of a fresh GPU): the
# expert-tier tests (and the llama static step's) on CUDA; then the captured Flash-Next step
# (16 layers) all on the device, and with half its experts in host RAM (uniform and skewed
# routing): the bus alone, half of each layer-step's misses on the host's cores, and `auto`
# (its timed costs in the log); then, as the call's time allows, 80 % and 25 % in host RAM
# with `auto` and the bus alone.
# Run from the repository root with OUT set; `.whl/` from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o bash bench/expert_split_device.sh
# PART=rest (after offload_peer_device.sh, which runs the tests and half and 80 % off at 0.5 and
# `auto`): 25 % off with the bus alone and `auto`, half off with the bus alone, then the
# worker's team at 14 and 16 threads (NINFER_EXPERT_CPU_THREADS; 12 was chosen on OpenMP).
source bench/device_env.sh
export PYTHONPATH=$PWD:/tmp/site
offload() {  # tag, expert_offload.py arguments...: one process, as long as the call allows
  local tag=$1
  shift
  [ "$(left)" -gt 90 ] || return 1
  timeout $(( $(left) - 10 )) python3 -u bench/expert_offload.py --layers 16 --steps 128 \
    --budget-s $(( $(left) - 60 )) --out "$OUT/r/offload-$tag" "$@" \
    > "$OUT/r/offload-$tag.log" 2>&1
  grep -E "B=|routing|auto:" "$OUT/r/offload-$tag.log" | tail -30
  grep -q Traceback "$OUT/r/offload-$tag.log" && tail -6 "$OUT/r/offload-$tag.log"
  return 0
}
if [ "${PART:-all}" = rest ]; then
  BUDGET=$(( BUDGET - 260 )) offload quarter --cpu-shares auto 0 \
    --only 0.25:tier:uniform 0.25:tier:skewed 0.5:tier:uniform 0.5:tier:skewed
  for t in 14 16; do
    NINFER_EXPERT_CPU_THREADS=$t BUDGET=$(( SECONDS + 130 < BUDGET ? SECONDS + 130 : BUDGET )) \
      offload "threads-$t" --cpu-shares 0.5 --only 0.5:tier:uniform
  done
  pack_results r
  exit
fi
gpu_tests 150 tests/experts/test_host_jobs.py tests/kernels/test_host_handoff.py \
  tests/experts/test_cuda_tiers.py tests/experts/test_cost_model.py \
  tests/engine/test_decode_graphs.py
offload half --cpu-shares 0 0.5 auto \
  --only 0:stacked:uniform 0.5:tier:uniform 0.5:tier:skewed
offload rest --cpu-shares 0 auto \
  --only 0.8:tier:uniform 0.8:tier:skewed 0.25:tier:uniform 0.25:tier:skewed
pack_results r
