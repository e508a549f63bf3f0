#!/usr/bin/env bash
# One call of a fresh H200 for issue 18's TTFT ratio and the verify step's kernels: the
# several-row GEMVs' K split (bench/verify_gemv_split.py), the served TTFT of 1K-token prompts
# one at a time and eight together (bench/ttft_burst_device.sh), then the tile sweep of the
# fused MoE kernels at a verify row's four rows on the 35B-A3B fp8-row shape
# (bench/moe_slot_sweep.py) with what the call has left.
#   OUT=/tmp/o bash bench/verify_kernels_device.sh
source bench/device_env.sh
PYTHONPATH=$PWD:/tmp/site timeout 90 python3 -u bench/verify_gemv_split.py \
  --out "$OUT/r/verify-gemv-split.json" > "$OUT/r/verify-gemv-split.log" 2>&1
cat "$OUT/r/verify-gemv-split.log" | grep -v Warning | tail -40
BUDGET=$((BUDGET - SECONDS)) bash bench/ttft_burst_device.sh
[ "$(left)" -gt 60 ] && PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u \
  bench/moe_slot_sweep.py --shapes 35b-a3b-fp8 --batches 4 --kernels gate_up,down,down_split \
  --budget $(($(left) - 40)) --out "$OUT/r/moe-slots-35b-fp8-b4.json" 2>&1 | tail -25
echo "done at $SECONDS s"
