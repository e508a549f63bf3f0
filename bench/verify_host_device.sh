#!/usr/bin/env bash
# Where a host-accepted verify step's gap goes (issue 18's 35B-A3B verify bound, ~7 minutes):
# the rollback's CUDA tests (`keep_rows` through the kernel; the free-draft chain's, the GDN
# kernels'), the GDN decode kernel's tiles timed at the real shapes (bench/gdn_decode_sweep.py:
# block_v by warps), the 35B-A3B fp8-row
# verify step on the device-accepted path with its drafting
# taken out (`--drafter free`), then the oracle verify
# step (1 + 3 tokens, 3.67 a round forced) with its host phases timed (`--phases`: schedule,
# drafts, launch, read-back, rollback, stats, events) and a cProfile of 200 steps (`--host`: by
# own and by cumulative time), its decode step, then `auto`'s hand-off policy at 25 % of
# Flash-Next's experts in host RAM, skewed (the row it was built for), beside the bus alone,
# each as the call's BUDGET allows. Run from the repository root
# with OUT set (carry `.whl` or `.whl-bench`; NOPACK=1 before another script in the call):
#   BUDGET=420 OUT=/tmp/o bash bench/verify_host_device.sh
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
gpu_tests 100 tests/engine/test_verify_chain.py tests/engine/test_hybrid_verify.py \
  tests/kernels/test_state_rollback.py tests/engine/test_free_draft_round.py \
  tests/kernels/test_gdn_decode.py tests/kernels/test_gdn_fused.py
PYTHONPATH=$PWD:/tmp/site timeout 130 python3 -u bench/gdn_decode_sweep.py --budget-s 100 \
  --out "$OUT/r/gdn-decode-sweep.json" > "$OUT/r/gdn-decode-sweep.log" 2>&1
grep -E "^summary|spent|Error" "$OUT/r/gdn-decode-sweep.log" | head -20
profile_step 35b-verify-free --spec 3 --drafter free
profile_step 35b-verify-host --spec 3 --phases --host
grep -E "^host phases|tottime|cumtime|foreach|keep|replay|tolist|_rollback|load|schedule|_finish" \
  "$OUT/r/step-35b-verify-host.log" | head -40
profile_step 35b-decode --spec 0
if [ "$(left)" -gt 80 ]; then
  PYTHONPATH=$PWD:/tmp/site timeout $(( $(left) - 5 )) python3 -u bench/expert_offload.py \
    --layers 16 --steps 128 --budget-s $(( $(left) - 40 )) --out "$OUT/r/offload-quarter" \
    --cpu-shares 0 auto --only 0.25:tier:skewed > "$OUT/r/offload-quarter.log" 2>&1
  grep -E "B=|routing|auto:" "$OUT/r/offload-quarter.log" | tail -8
fi
echo "done at $SECONDS s"
pack_results
