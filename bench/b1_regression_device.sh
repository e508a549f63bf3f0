#!/usr/bin/env bash
# Issue 18's batch-1 bound as a regression check on whatever card the call gets: `ninfer bench`
# at 1K context, B = 1, of the last tree whose bench timed the KernelDecoder the issue measured
# (28444cc, over pools of its own; its child moved that class into tests/ while the bench still
# imported it) and of this tree (the engine's own step), per shape, in one call on one card,
# alternated so that clocks and heat fall on both. Then, on an H200 and as time is left, this
# tree's verify steps (bench/profile_step.py). Carry `.whl` and `.peers/tree-28444cc.tar.xz`,
# made by
#   git archive 28444cc ninfer_engine ninfer_http ninfer_tui | xz > .peers/tree-28444cc.tar.xz
#   BUDGET=560 OUT=/tmp/o bash bench/b1_regression_device.sh
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
mkdir -p /tmp/base && tar xJf .peers/tree-28444cc.tar.xz -C /tmp/base
b1() {  # tag tree arch weights [flags]: one B = 1 decode at 1K into $OUT/r/b1-ARCH-TAG.*
  local tag=$1 tree=$2 arch=$3 weights=$4
  shift 4
  [ "$(left)" -gt 60 ] || { echo "$tag $arch: no time left"; return; }
  PYTHONPATH=$tree:/tmp/site timeout "$(( $(left) - 20 ))" python3 -P -m ninfer_engine.cli.tools \
    bench --arch "$arch" --weights "$weights" --context 1024 --concurrency none --prefill 0 \
    --no-peer "$@" --out "$OUT/r/b1-$arch-$tag.json" > /dev/null 2> "$OUT/r/b1-$arch-$tag.log"
  local line
  line=$(grep -iE '^context|error' "$OUT/r/b1-$arch-$tag.log" | tail -1)
  echo "$tag $arch $weights: $line at $SECONDS s"
}
# (SHAPES: arch:weights pairs; Flash-Next's 48 layers fit no H100)
for shape in ${SHAPES:-35b-a3b:fp8-row flash-next:fp8-row 27b:bf16}; do
  b1 now "$PWD" ${shape/:/ } --spec-rates none
  b1 issue /tmp/base ${shape/:/ }
done
b1 now-again "$PWD" 35b-a3b fp8-row --spec-rates none
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then  # (the H100's:
  profile_step 35b-verify --spec 3                                       # h100-issue-bounds-*)
  profile_step 27b-verify --arch 27b --weights bf16 --spec 3
fi
echo "done at $SECONDS s"
pack_results
