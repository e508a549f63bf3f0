#!/usr/bin/env bash
# The graphs a `--spec mtp` server captures at load, in one call: (1) the CUDA tests of the
# decode, verify, MTP round and verify chain graphs; (2) the served 8-layer 35B-A3B fp8-row
# shape with a random MTP head (`ninfer synth --mtp`), `--spec mtp --draft-tokens 3`, 8 rows, 8K
# context: the start-up log's capture lines (seconds, MiB) and two bursts of 8 prompts of ~1.5K
# tokens (contexts past the first bucket), then any graph captured and any Triton variant
# compiled in traffic. TESTS=0 skips (1). TREE: a carried tree whose packages come first on the
# path (`git archive <commit> ninfer_engine | tar -x -C .old`), its log and bursts tagged TREE.
# TRACE=1: each step's rows and each eager forward's in the log (`bench/trace_rows`), then the
# warm-up's eager steps of few one-token rows and the steps before each compile in traffic.
#   OUT=/tmp/o [TESTS=0] [TREE=.old] [TRACE=1] bash bench/start_capture_device.sh
source bench/device_env.sh
export PYTHONPATH=${TRACE:+$PWD/bench/trace_rows:}${TREE:+$PWD/$TREE:}$PWD:/tmp/site
TAG=${TREE:+-${TREE#.}}
nvidia-smi --query-gpu=name --format=csv,noheader
[ "${TESTS:-1}" = 1 ] && gpu_tests 210 tests/engine/test_mtp_round.py \
  tests/engine/test_verify_chain.py tests/engine/test_verify_chain_engine.py \
  tests/engine/test_step_rows.py tests/engine/test_hybrid_verify.py
MODEL=/dev/shm/ninfer-35b-a3b-8-fp8-row-mtp.ninfer
[ -f "$MODEL" ] || python3 -m ninfer_engine.cli.tools synth --arch 35b-a3b --layers 8 \
  --recipe fp8-row --mtp --device cuda -o "$MODEL" > "$OUT/r/synth.log" 2>&1 \
  || tail -5 "$OUT/r/synth.log"  # (kept in /dev/shm for the call's next run)
LOG=$OUT/r/serve-mtp$TAG.log
setsid python3 -P -m ninfer_tui.cli "$MODEL" --no-tui --host 127.0.0.1 --port 18080 \
  --model-id bench --max-concurrency 8 --max-context 8192 --kv-capacity 65536 \
  --spec mtp --draft-tokens 3 > "$LOG" 2>&1 &
pid=$!
for _ in $(seq 240); do curl -sf http://127.0.0.1:18080/health >/dev/null && break; sleep 1; done
echo "--spec mtp server healthy at $SECONDS s"
ready=$(wc -l < "$LOG")
for round in 1 2; do
  timeout 90 python3 bench/serve_staggered.py http://127.0.0.1:18080 bench --burst \
    --concurrency 8 --requests 16 --max-tokens 64 --prompt-chars 6500 --label "mtp$round$TAG" \
    --json "$OUT/r/burst-mtp-$round$TAG.json" 2>&1 | tail -2
done
kill -INT $pid; sleep 3; kill -9 $pid 2>/dev/null
grep -E "start-up CUDA graphs|--spec mtp" "$LOG" | cut -c1-220
echo "graphs captured at start-up: $(head -n "$ready" "$LOG" | grep -c 'captured the')"
echo "graphs captured in traffic: $(tail -n +"$((ready + 1))" "$LOG" | grep -c 'captured the')"
tail -n +"$((ready + 1))" "$LOG" | grep 'captured the' | cut -c1-200 | head -5
echo "Triton variants compiled in traffic: $(grep -c 'Triton compiled' "$LOG")"
grep 'Triton compiled' "$LOG" | cut -c1-400 | head -8
if [ -n "$TRACE" ]; then
  echo "warm-up's eager steps of few rows with a one-token row (count, rows):"
  head -n "$ready" "$LOG" | grep 'trace eager' | sed 's/.*rows //' | grep '(1, ' \
    | awk 'length($0) < 90' | sort | uniq -c | sort -rn | head -12
  echo "the steps before each compile in traffic:"
  tail -n +"$((ready + 1))" "$LOG" | grep -B4 'Triton compiled' | grep 'trace' | cut -c24-200
fi
echo "done at $SECONDS s"
pack_results
