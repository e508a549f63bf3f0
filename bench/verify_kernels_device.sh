#!/usr/bin/env bash
# One call of a fresh H200 for the verify step's kernels and issue 19's policy column: the
# several-row GEMVs' K split (bench/verify_gemv_split.py); `ninfer bench`'s speculative section
# on the whole 35B-A3B fp8-row shape at B=1 and 8 (oracle drafts, 3.67 and 2.4 tokens a round),
# whose "under the policy" column is the served path with the lookahead step under --spec;
# then the tile sweep of the fused MoE kernels at a verify row's four rows on the same shape
# (bench/moe_slot_sweep.py) with what the call has left.
#   OUT=/tmp/o bash bench/verify_kernels_device.sh
source bench/device_env.sh
PYTHONPATH=$PWD:/tmp/site timeout 90 python3 -u bench/verify_gemv_split.py \
  --out "$OUT/r/verify-gemv-split.json" > "$OUT/r/verify-gemv-split.log" 2>&1
grep -v Warning "$OUT/r/verify-gemv-split.log" | tail -40
PYTHONPATH=$PWD:/tmp/site timeout 300 python3 -u -m ninfer_engine.cli.tools bench \
  --arch 35b-a3b --weights fp8-row --context 1024 --concurrency 1,8 --prefill 0 \
  --draft-tokens 3 --spec-rates 3.67,2.4 --spec-batch 1,8 --no-peer \
  --out "$OUT/r/bench-spec.json" > "$OUT/r/bench-spec.log" 2>&1
grep -E "^\| [18] \| 1024 \|" "$OUT/r/bench-spec.log" || tail -5 "$OUT/r/bench-spec.log"
[ "$(left)" -gt 60 ] && PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u \
  bench/moe_slot_sweep.py --shapes 35b-a3b-fp8 --batches 4 --kernels gate_up,down,down_split \
  --budget $(($(left) - 40)) --out "$OUT/r/moe-slots-35b-fp8-b4.json" 2>&1 | tail -25
echo "done at $SECONDS s"
pack_results
