#!/usr/bin/env bash
# What e4m3 prompt activations in the fp8-row projections (`kernels.fp8_rows_matmul`) buy, in one
# call: each projection alone at the real shapes (bench/fp8_dense_bench.py), then the engine's 8K
# prefill (`ninfer bench --prefill 8192`, 4096-token chunks) of the 27B and 35B-A3B fp8-row
# shapes with `--prefill-activations`'s engine default against the tree before the change
# (OLD=dir: that tree's ninfer_engine/ and bench/, carried; skipped without it), in turn; before
# them, the CUDA tests of the fp8 paths (this tree's row-wise `_scaled_mm` probe has not run on a
# GPU yet).
#   git archive eafdb61 ninfer_engine bench | tar -x -C .old   (ignored; carry .old)
#   OUT=/tmp/o OLD=.old bash bench/prefill_fp8_device.sh
source bench/device_env.sh
# first the CUDA tests of the fp8 paths (the row-wise probe runs at the first prompt step)
gpu_tests 150 tests/models/test_packed.py tests/kernels/test_moe_grouped_fp8_act.py \
  tests/engine/test_prompt_graphs.py tests/engine/test_warm_up.py tests/cli/test_flags.py
python3 bench/fp8_dense_bench.py --json "$OUT/r/fp8-dense.json" > "$OUT/r/fp8-dense.log" 2>&1
echo "projections: $(grep -c T= "$OUT/r/fp8-dense.log") rows at $SECONDS s"
for arch in 27b 35b-a3b; do
  prefill_bench new "$PWD" $arch
  [ -n "${OLD:-}" ] && prefill_bench old "$(cd "$OLD" && pwd)" $arch
done
pack_results
