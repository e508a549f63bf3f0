#!/usr/bin/env bash
# Issue 18's batch-1 bounds alone, for a short call on the H200 the issue names (~5 minutes):
# the 35B-A3B fp8-row decode (>= 530 tok/s) and its verify step of 1 + 3 tokens on both
# acceptance paths (<= 2.0x decode), Flash-Next fp8-row decode (>= 430), the 27B bf16 decode
# (>= 74) and verify (<= 1.3x) through bench/profile_step.py; then, as time is left, the
# warm-up's host-accepted rollback test run twice, with the start-up launch cut out (it must
# fail) and as committed (it must pass), and the GDN decode kernel's forms
# (bench/gdn_decode_sweep.py). Carry `.whl`:
#   BUDGET=430 OUT=/tmp/o bash bench/issue18_bounds_device.sh
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
profile_step 35b-decode --spec 0
profile_step 35b-verify --spec 3 --phases
profile_step 35b-verify-free --spec 3 --drafter free
profile_step flash-next-decode --arch flash-next --spec 0
profile_step 27b-decode --arch 27b --weights bf16 --spec 0
profile_step 27b-verify --arch 27b --weights bf16 --spec 3
rollback_test() {  # name: the warm-up's rollback test into $OUT/r/NAME.txt
  [ "$(left)" -gt 60 ] || return
  PYTHONPATH=$PWD:/tmp/site NINFER_TEST_DEVICE=cuda timeout 60 python3 -m pytest -q \
    -o addopts="" -p no:cacheprovider --tb=line \
    tests/engine/test_warm_up.py::test_after_the_warm_up_a_host_accepted_rollback_compiles_nothing \
    > "$OUT/r/$1.txt" 2>&1
  echo "$1: $(tail -1 "$OUT/r/$1.txt")"
}
graphs=ninfer_engine/step/decode_graphs.py
cp "$graphs" /tmp/decode_graphs.py
sed -i 's/^\( *\)self.decoder.keep_rows(\[(0, self.decoder.max_q)\])$/\1pass/' "$graphs"
cmp -s "$graphs" /tmp/decode_graphs.py && echo "mutation not applied"
rollback_test rollback-test-mutated
cp /tmp/decode_graphs.py "$graphs"
rollback_test rollback-test
if [ "$(left)" -gt 50 ]; then
  PYTHONPATH=$PWD:/tmp/site timeout $(( $(left) - 10 )) python3 -u bench/gdn_decode_sweep.py \
    --budget-s $(( $(left) - 30 )) --out "$OUT/r/gdn-decode-sweep.json" \
    > "$OUT/r/gdn-decode-sweep.log" 2>&1
  grep -E "^summary|spent|Error" "$OUT/r/gdn-decode-sweep.log" | head -10
fi
echo "done at $SECONDS s"
pack_results
