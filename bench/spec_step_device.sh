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

profile_step decode --spec 0
profile_step verify --spec 3 --timeline "$OUT/r/verify-trace.json" \
  && grep -E "^(timeline|GPU busy|  gap)" "$OUT/r/step-verify.log" | head -30
profile_step verify-mtp --spec 3 --drafter mtp --timeline "$OUT/r/verify-mtp-trace.json" \
  && grep -E "^(timeline|GPU busy|  gap)" "$OUT/r/step-verify-mtp.log" | head -30
[ -n "$OLD" ] && TREE=$PWD/$OLD profile_step verify-old --spec 3
echo "done at $SECONDS s"
pack_results
