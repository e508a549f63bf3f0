#!/usr/bin/env bash
# The prompt step's pending device evidence in one call (~8 minutes of a fresh H200): the GPU
# tests of the prompt step (several chunks in one replay, beside verify rows, hiddens for a
# drafter) and of the steps around it; the host-tier turn (`host_tier_ttft.py`); an agent
# replay whose turns are short tool results (48 new tokens: the prompt step's rows), four at a
# time; the decode and verify steps at B=1; the host-tier turn on all 40 layers if time is
# left. With OLD set to another tree's checkout (e.g. `git archive <rev> ninfer_engine bench`
# unpacked under .peers/old, carried), the turn, the replay and the steps run there too, in
# turn, in the same call. Run from the repository root with OUT set; `.whl/`
# from `bash scripts/device_wheels.sh`.
#   OUT=/tmp/o [OLD=.peers/old] bash bench/prompt_step_device.sh
source bench/device_env.sh
trees="new${OLD:+ old}"
root() { if [ "$1" = old ]; then echo "$PWD/$OLD"; else echo "$PWD"; fi; }

gpu_tests 150 tests/engine/test_prompt_graphs.py tests/engine/test_hybrid_graphs.py \
  tests/engine/test_hybrid_verify.py tests/engine/test_dflash_graph_taps.py \
  tests/engine/test_mtp_prefix_reuse.py tests/kernels/test_gdn_decode.py \
  tests/kernels/test_gdn_fused.py tests/kernels/test_paged_prefill.py
for tree in $trees; do
  R=$(root $tree)
  [ "$(left)" -gt 60 ] || break
  PYTHONPATH=$R:/tmp/site timeout "$(left)" python3 -u "$R/bench/host_tier_ttft.py" --layers 8 \
    --prompt 32768 --out "$OUT/r/ttft-$tree" > "$OUT/r/ttft-$tree.log" 2>&1
  echo "host-tier turn, $tree:"; grep -E "^\| dev" "$OUT/r/ttft-$tree.log"
done
for tree in $trees; do
  R=$(root $tree)
  [ "$(left)" -gt 90 ] || break
  PYTHONPATH=$R:/tmp/site timeout "$(left)" python3 -u "$R/bench/agent_replay.py" \
    --arch 35b-a3b --layers 8 --weights fp8-row --agents 8 --turns 8 --system 8192 \
    --user 48 --answer 32 --concurrency 4 --device-conversations 4 \
    --out "$OUT/r/replay-$tree" > "$OUT/r/replay-$tree.log" 2>&1
  echo "agent replay (48-token turns), $tree:"; grep -E "^\|" "$OUT/r/replay-$tree.log" | head -6
done
for tree in $trees; do
  R=$(root $tree)
  for spec in 0 3; do
    [ "$(left)" -gt 40 ] || break 2
    PYTHONPATH=$R:/tmp/site timeout "$(left)" python3 -u "$R/bench/profile_step.py" \
      --arch 35b-a3b --weights fp8-row --layers 8 --spec $spec > "$OUT/r/step-$tree-$spec.log" 2>&1
    echo "step $tree spec=$spec: $(grep -E 'engine step' "$OUT/r/step-$tree-$spec.log")"
  done
done
if [ "$(left)" -gt 150 ]; then  # the whole 35B-A3B shape, this tree only
  PYTHONPATH=$PWD:/tmp/site timeout "$(left)" python3 -u bench/host_tier_ttft.py --prompt 32768 \
    --out "$OUT/r/ttft-40l" > "$OUT/r/ttft-40l.log" 2>&1
  echo "host-tier turn, all 40 layers:"; grep -E "^\| dev" "$OUT/r/ttft-40l.log"
fi
echo "done at $SECONDS s"
pack_results
