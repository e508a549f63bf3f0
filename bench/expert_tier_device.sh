#!/usr/bin/env bash
# Issue 20's pending device evidence in one call (~7 minutes of a fresh H200): the expert-tier
# GPU tests, the console on a 4-layer Flash-Next fp8-row artifact with half its experts in host
# RAM, KV room to lend (--max-context 65536 over the 8,192-token grow step) and
# `--expert-cpu-share auto` (an SVG of the real expert panel under load: lent pages, and the
# layers sharing their misses with the host's cores), and the captured step at a quarter, half
# and 80 % of the experts off the device (16 layers), without and with `auto`, at the worker's
# default team size. Run from the repository root with OUT set; `.whl/` from
# `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o bash bench/expert_tier_device.sh
source bench/device_env.sh
export PYTHONPATH=$PWD:/tmp/site
mkdir -p "$OUT/shots"
NINFER_TEST_DEVICE=cuda timeout 170 python3 -m pytest -q -m "not slow" -p no:cacheprovider \
  -rfE --tb=short tests/experts/test_host_jobs.py tests/experts/test_cuda_tiers.py \
  > "$OUT/r/tier-tests.txt" 2>&1
echo "tier tests: $(tail -1 "$OUT/r/tier-tests.txt")"
python3 -c "
from ninfer_engine.artifact.synth import write_synthetic
write_synthetic('flash-next', '/dev/shm/fn4.ninfer', layers=4, recipe='fp8-row', device='cuda',
                name='flash-next-4l-random')" 2>&1 | grep -v Warning | tail -2
timeout 200 python3 -u scripts/console_screenshot.py --terminal pty --ready-timeout 120 \
  --warm 30 --clients 8 --max-tokens 48 --name console_h200_experts --out "$OUT/shots" \
  -- /dev/shm/fn4.ninfer --expert-vram-mib 3200 --elastic --max-context 65536 \
  --max-concurrency 8 --expert-cpu-share auto \
  > "$OUT/r/console.txt" 2>&1
echo "console: $(grep -c svg "$OUT/r/console.txt") shot(s); $(tail -4 "$OUT/r/console.txt")"
rm -f /dev/shm/fn4.ninfer
rest=$(left)  # the rest of a 600-second device call, whatever the steps above took
timeout "$rest" python3 -u bench/expert_offload.py --layers 16 --steps 128 --budget-s $((rest - 40)) \
  --cpu-shares 0 auto --only 0:stacked:uniform 0:stacked:skewed 0.5:tier:uniform \
  0.5:tier:skewed 0.8:tier:uniform 0.8:tier:skewed 0.25:tier:uniform 0.25:tier:skewed \
  --out "$OUT/r/expert-offload" > "$OUT/r/expert-offload.log" 2>&1
grep -E "B=|routing" "$OUT/r/expert-offload.log" | tail -40
grep -q Traceback "$OUT/r/expert-offload.log" && tail -6 "$OUT/r/expert-offload.log"  # why it stopped
pack_results r shots
