#!/usr/bin/env bash
# Batch-1 decode steps of two trees in turn in one call (issue 18's no-regression bounds): the
# engine's step and its graph replayed alone (bench/profile_step.py, random fp8-row weights,
# context 1024) for each ARCHS shape, this tree and a carried OLD tree alternated new/old/new/old,
# each run's kernel table kept in $OUT/r/step-ARCH-TREE-ROUND.log.
#   OUT=/tmp/o OLD=.old-b1 ARCHS="35b-a3b flash-next" bash bench/b1_step_device.sh
source bench/device_env.sh
OLD=${OLD:?carry an older tree and name it}
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
for arch in ${ARCHS:-35b-a3b flash-next}; do
  for round in 1 2; do
    for tree in new old; do
      root=$PWD; [ $tree = old ] && root=$PWD/$OLD
      TREE=$root profile_step "$arch-$tree-$round" --arch "$arch" --batch 1 || break 3
    done
  done
done
echo "done at $SECONDS s"
pack_results
