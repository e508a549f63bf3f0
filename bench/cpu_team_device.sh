#!/usr/bin/env bash
# The worker's host jobs on their spinning team against an OpenMP team (issue 20), in one call
# (~7 minutes of a fresh GPU): the captured Flash-Next step (16 layers) with half its experts
# off the device, uniform and skewed routing, all on the bus, with the split's kernels but
# nothing handed over (0.01), half the misses on the cores and `auto` (whose measured costs
# the log shows); then 0.5 and `auto` again with the jobs on OpenMP (a second process); then
# the expert-tier tests on CUDA. `host job ms/step` against the CPU share gives a job's fixed
# and per-expert cost inside the step.
# Run from the repository root with OUT set; `.whl/` from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o bash bench/cpu_team_device.sh
source bench/device_env.sh
export PYTHONPATH=$PWD:/tmp/site
offload() {  # tag, budget seconds, expert_offload.py arguments...
  local tag=$1 budget=$2
  shift 2
  timeout $((budget + 30)) python3 -u bench/expert_offload.py --layers 16 --steps 128 \
    --budget-s "$budget" --out "$OUT/r/offload-$tag" "$@" > "$OUT/r/offload-$tag.log" 2>&1
  grep -E "B=|routing|auto:" "$OUT/r/offload-$tag.log" | tail -30
  grep -q Traceback "$OUT/r/offload-$tag.log" && tail -6 "$OUT/r/offload-$tag.log"
}
offload spin 230 --cpu-shares 0 0.01 0.5 auto \
  --only 0:stacked:uniform 0.5:tier:uniform 0.5:tier:skewed
echo "spin done at $SECONDS s"
offload openmp $(( $(left) - 150 )) --cpu-team openmp --cpu-shares 0.5 auto \
  --only 0.5:tier:uniform 0.5:tier:skewed
echo "openmp done at $SECONDS s"
NINFER_TEST_DEVICE=cuda timeout $(( $(left) - 5 )) python3 -m pytest -q -m "not slow" \
  -p no:cacheprovider -rfE --tb=short tests/experts/test_host_jobs.py \
  tests/kernels/test_host_handoff.py tests/experts/test_cuda_tiers.py > "$OUT/r/tier-tests.txt" 2>&1
echo "tests: $(tail -1 "$OUT/r/tier-tests.txt") at $SECONDS s"
grep -E "^(FAILED|ERROR)" "$OUT/r/tier-tests.txt" | head
pack_results r
