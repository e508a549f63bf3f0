#!/usr/bin/env bash
# The CPU expert kernel on the device host (issue 20), in one call (~8 minutes of a fresh GPU):
# the host CPU's vector features and its transparent huge pages; the kernel's forms at the
# worker's team sizes, per prefetch distance and per kind of memory (bench/cpu_expert_kernel.py,
# 256 experts: 0.8 GB a kind, past the L3), beside torch's read of the same memory; the
# expert-tier CPU tests on CUDA; then the captured Flash-Next step (16 layers) with half its
# experts off the device (uniform and skewed routing), without and with the host's cores
# (`auto`, 0.5 of each layer-step's misses) at the distance that read fastest (PF
# overrides it).
# Run from the repository root with OUT set; `.whl/` from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o [PF=bytes] bash bench/cpu_expert_form_device.sh
source bench/device_env.sh
export PYTHONPATH=$PWD:/tmp/site
lscpu > "$OUT/r/lscpu.txt"
echo "host: $(grep -m1 'Model name' "$OUT/r/lscpu.txt" | cut -c1-80);" \
  "$(grep -o -E 'avx512vbmi|avx512_bf16|amx_bf16' "$OUT/r/lscpu.txt" | sort -u | tr '\n' ' ')" \
  "THP $(cat /sys/kernel/mm/transparent_hugepage/enabled)"
timeout 200 python3 bench/cpu_expert_kernel.py --pairs 2 5 --experts 256 --threads 12 16 \
  --prefetch 0 1024 4096 --memory pinned huge-pinned --isas avx512-bf16 \
  --out "$OUT/r/cpu-expert-kernel" > "$OUT/r/cpu-expert-kernel.log" 2>&1
grep -E "threads" "$OUT/r/cpu-expert-kernel.log" | sort -t, -k4 -rn | head -10
grep -E "pinned +avx512-bf16 +prefetch +0:" "$OUT/r/cpu-expert-kernel.log"
grep -q Traceback "$OUT/r/cpu-expert-kernel.log" && tail -5 "$OUT/r/cpu-expert-kernel.log"
PF=${PF:-$(python3 -c "
import json; r = json.load(open('$OUT/r/cpu-expert-kernel.json'))['rows']
r = [x for x in r if x['threads'] == 12 and x['memory'] == 'pinned' and x['pairs'] == 5]
print(min(r, key=lambda x: x['ms'])['prefetch'])" 2>/dev/null || echo 0)}
echo "prefetch for the step: $PF bytes at $SECONDS s"
NINFER_TEST_DEVICE=cuda timeout 100 python3 -m pytest -q -m "not slow" -p no:cacheprovider \
  -rfE --tb=short tests/experts/test_host_jobs.py tests/kernels/test_cpu_experts.py \
  tests/kernels/test_host_handoff.py tests/experts/test_cuda_tiers.py \
  > "$OUT/r/tier-tests.txt" 2>&1
echo "tests: $(tail -1 "$OUT/r/tier-tests.txt") at $SECONDS s"
rest=$(left)
timeout "$rest" python3 -u bench/expert_offload.py --layers 16 --steps 128 \
  --budget-s $((rest - 40)) --cpu-shares 0 auto 0.5 --cpu-prefetch "$PF" \
  --only 0:stacked:uniform 0.5:tier:uniform 0.5:tier:skewed \
  --out "$OUT/r/expert-offload" > "$OUT/r/expert-offload.log" 2>&1
grep -E "B=|routing" "$OUT/r/expert-offload.log" | tail -24
grep -q Traceback "$OUT/r/expert-offload.log" && tail -6 "$OUT/r/expert-offload.log"
pack_results r
