#!/usr/bin/env bash
# Issues 18's and 19's batch-1 figures in one call (~9 minutes; meant for the H200 the issues
# name): the llama static and prompt steps' CUDA tests; the engine step and its graph alone
# (bench/profile_step.py, random weights, context 1024) for 35B-A3B fp8-row (decode >= 530
# tok/s; the oracle verify step of 1 + 3 tokens <= 2.0x decode, its host phases timed, and the
# same step on the device-accepted path with its drafting taken out (--drafter free); the
# --spec mtp round over the --lm-head-draft shortlist at 3.67 tokens a round, issue 19's
# >= 1,100 tok/s), the 27B bf16 (decode >= 74; verify <= 1.3x; the MTP round, >= 200) and
# Flash-Next fp8-row decode (>= 430);
# the llama family's verify step replayed from its graph against the eager forward it
# replaced, and a 64-token prompt chunk through its new prompt step against the eager forward
# (bench/gpu_engine_decode.py --verify 3 --prompt 64); the MoE kernels' tiles at the verify
# step's 4 rows (bench/moe_slot_sweep.py); the 27B rows last (measured on 12-06), so BUDGET=450
# leaves a call its time for another script.
#   OUT=/tmp/o bash bench/issue_bounds_device.sh
source bench/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
gpu_tests 180 tests/engine/test_llama_prompt_step.py tests/engine/test_decode_graphs.py \
  tests/engine/test_step_rows.py tests/engine/test_speculation.py tests/experts/test_host_jobs.py \
  tests/experts/test_handoff_policy.py tests/kernels/test_state_rollback.py \
  tests/engine/test_verify_chain.py tests/engine/test_warm_up.py tests/kernels/test_gdn_decode.py \
  tests/engine/test_free_draft_round.py
profile_step 35b-decode --spec 0
profile_step 35b-verify --spec 3 --phases
profile_step 35b-verify-free --spec 3 --drafter free
profile_step flash-next-decode --arch flash-next --spec 0
profile_step 35b-mtp --spec 3 --drafter mtp --lm-head-draft 131072
if [ "$(left)" -gt 120 ]; then  # (before the 27B: the llama steps' first timed GPU run)
  PYTHONPATH=$PWD:/tmp/site timeout 110 python3 bench/gpu_engine_decode.py \
    --shapes llama-3.2-1b,qwen3-8b --batches 1,8 --verify 3 --prompt 64 \
    --out "$OUT/r/llama-verify" \
    2>&1 | grep -E "B=" | tail -8
fi
if [ "$(left)" -gt 90 ]; then  # the MoE tiles at a verify step's 4 rows, then 1 (<= 150 s)
  sweep=$(( $(left) > 200 ? 150 : $(left) - 40 ))
  PYTHONPATH=$PWD:/tmp/site timeout $(( sweep + 30 )) python3 bench/moe_slot_sweep.py \
    --shapes 35b-a3b-fp8 --batches 4,1 --kernels gate_up,down --budget $sweep \
    --out "$OUT/r/moe-slots-35b-fp8.json" 2>&1 | grep -E "^\| 35b" | tail -8
fi
profile_step 27b-decode --arch 27b --weights bf16 --spec 0
profile_step 27b-verify --arch 27b --weights bf16 --spec 3
profile_step 27b-mtp --arch 27b --weights bf16 --spec 3 --drafter mtp --lm-head-draft 131072
echo "done at $SECONDS s"
pack_results
