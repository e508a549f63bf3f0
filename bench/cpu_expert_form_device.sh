#!/usr/bin/env bash
# The CPU expert kernel's bf16 form on the device host (issue 20), in one call (~9 minutes of a
# fresh H200): the host CPU's vector features; the kernel's forms timed in turn at the worker's
# team sizes (bench/cpu_expert_kernel.py, experts past the L3); the bus and the cores reading
# host memory alone and at once (bench/host_contention.py); the expert-tier CUDA tests; then
# the captured Flash-Next step (16 layers) with half its experts off the device, without and
# with the host's cores (`auto` and a fixed half of the misses), uniform and skewed routing.
# Run from the repository root with OUT set; `.whl/` from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o bash bench/cpu_expert_form_device.sh
source bench/device_env.sh
export PYTHONPATH=$PWD:/tmp/site
lscpu > "$OUT/r/lscpu.txt"
echo "host: $(grep -m1 'Model name' "$OUT/r/lscpu.txt" | cut -c1-80);" \
  "$(grep -o -E 'avx512_vbmi |avx512_bf16|amx_bf16|avx512_fp16' "$OUT/r/lscpu.txt" | sort -u | tr '\n' ' ')"
timeout 120 python3 bench/cpu_expert_kernel.py --pairs 5 10 --experts 96 --threads 8 12 \
  --out "$OUT/r/cpu-expert-kernel-h200" 2>&1 | tail -4
timeout 90 python3 bench/host_contention.py --seconds 2 --out "$OUT/r/host-contention" \
  > "$OUT/r/host-contention.log" 2>&1
grep -E "GB/s|µs" "$OUT/r/host-contention.log" | tail -6
NINFER_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -m "not slow" -p no:cacheprovider \
  -rfE --tb=short tests/experts/test_host_jobs.py tests/kernels/test_cpu_experts.py \
  > "$OUT/r/tier-tests.txt" 2>&1
echo "tests: $(tail -1 "$OUT/r/tier-tests.txt") at $SECONDS s"
rest=$(left)
timeout "$rest" python3 -u bench/expert_offload.py --layers 16 --steps 128 \
  --budget-s $((rest - 40)) --cpu-shares 0 auto 0.5 --only 0:stacked:uniform \
  0.5:tier:uniform 0.5:tier:skewed 0.8:tier:uniform \
  --out "$OUT/r/expert-offload" > "$OUT/r/expert-offload.log" 2>&1
grep -E "B=|routing" "$OUT/r/expert-offload.log" | tail -30
grep -q Traceback "$OUT/r/expert-offload.log" && tail -6 "$OUT/r/expert-offload.log"
pack_results r
