#!/usr/bin/env bash
# Where a verify round's time goes, in one call (~7 minutes of a fresh H200): the GPU tests that
# pin its host syncs (a verify round, an MTP drafting round) and those of the commits since the
# last GPU run (the prompt step's); then, on the whole 35B-A3B fp8-row shape at B=1, the decode
# step, the verify step of 3 oracle drafts with its timeline (the GPU's idle gaps and the host
# work in each: issue 18's verify / decode ratio, 2.5-2.7x against its graph's 1.89x), and the
# verify step drafted by the MTP head (what --spec mtp's drafting adds: issue 19). With OLD set
# to another tree's checkout (carried), its verify step runs too, in the same call. Run from the
# repository root with OUT set; `.whl/` from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o [OLD=.peers/old] bash bench/spec_step_device.sh
source bench/device_env.sh
gpu_tests 150 tests/engine/test_verify_step_syncs.py tests/engine/test_mtp_draft_syncs.py \
  tests/engine/test_prompt_graphs.py tests/engine/test_hybrid_graphs.py \
  tests/engine/test_hybrid_verify.py tests/engine/test_dflash_graph_taps.py \
  tests/engine/test_lookahead_gpu.py tests/kernels/test_gdn_decode.py \
  tests/kernels/test_paged_prefill.py

step() {  # name, tree root, profile_step arguments
  local name=$1 R=$2
  shift 2
  [ "$(left)" -gt 60 ] || return 1
  PYTHONPATH=$R:/tmp/site timeout "$(left)" python3 -u "$R/bench/profile_step.py" \
    --arch 35b-a3b --weights fp8-row "$@" > "$OUT/r/step-$name.log" 2>&1
  echo "$name: $(grep -E 'engine step' "$OUT/r/step-$name.log")"
}
step decode "$PWD" --spec 0
step verify "$PWD" --spec 3 --timeline "$OUT/r/verify-trace.json" \
  && grep -E "^(timeline|GPU busy|  gap)" "$OUT/r/step-verify.log" | head -30
step verify-mtp "$PWD" --spec 3 --drafter mtp --timeline "$OUT/r/verify-mtp-trace.json" \
  && grep -E "^(timeline|GPU busy|  gap)" "$OUT/r/step-verify-mtp.log" | head -30
[ -n "$OLD" ] && step verify-old "$PWD/$OLD" --spec 3
echo "done at $SECONDS s"
