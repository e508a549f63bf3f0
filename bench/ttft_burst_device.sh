#!/usr/bin/env bash
# Issue 18's TTFT ratio in one short call: the served 8-layer 35B-A3B fp8-row shape (random
# weights, `ninfer synth`), one ninfer-serve (the settings of bench/served_load.sh), TTFT
# p50/p99 of 1K-token prompts arriving one at a time, then 8 together, ROUNDS times each
# (default 2; bench/serve_staggered.py --burst), with the start-up log's warm-up and capture
# lines; one server per --prefill-chunk in CHUNKS (default: the server's own auto, 8192 on a
# device of >= 70 GiB). LAYERS (default 8): the shape's depth, 40 for the whole 35B-A3B. TREE: a
# carried tree whose packages come first on the path (`git archive <commit> ninfer_engine | tar
# -x -C .old`: its engine, this tree's HTTP server and console).
#   OUT=/tmp/o [CHUNKS="4096 8192"] [ROUNDS=4] [LAYERS=40] [TREE=.old] bash bench/ttft_burst_device.sh
#   (then bench/ttft_burst_table.py OUT/r: the table)
source bench/device_env.sh
LAYERS=${LAYERS:-8}
MODEL=/dev/shm/ninfer-35b-a3b-$LAYERS-fp8-row.ninfer
export PYTHONPATH=${TREE:+$PWD/$TREE:}$PWD:/tmp/site
[ -f "$MODEL" ] || python3 -m ninfer_engine.cli.tools synth --arch 35b-a3b --layers "$LAYERS" \
  --recipe fp8-row --device cuda -o "$MODEL" > "$OUT/r/synth.log" 2>&1 \
  || tail -5 "$OUT/r/synth.log"  # (kept in /dev/shm for the call's next run)
for chunk in ${CHUNKS:-auto}; do
  flag=() tag=""
  [ "$chunk" = auto ] || { flag=(--prefill-chunk "$chunk"); tag="-p$chunk"; }
  setsid python3 -P -m ninfer_tui.cli "$MODEL" --no-tui --host 127.0.0.1 --port 18080 \
    --model-id bench --max-concurrency 8 --max-context 8192 --kv-capacity 65536 "${flag[@]}" \
    --log-stats-interval-ms 1000 --request-log-jsonl "$OUT/r/requests$tag.jsonl" \
    > "$OUT/r/serve$tag.log" 2>&1 &
  pid=$!
  for _ in $(seq 300); do curl -sf http://127.0.0.1:18080/health >/dev/null && break; sleep 1; done
  echo "prefill chunk $chunk: healthy at $SECONDS s"
  for round in $(seq "${ROUNDS:-2}"); do
    for c in 1 8; do
      timeout 120 python3 bench/serve_staggered.py http://127.0.0.1:18080 bench --burst \
        --concurrency $c --requests 16 --max-tokens 64 --prompt-chars 4300 \
        --label "burst$c-$round$tag" --json "$OUT/r/burst-c$c-$round$tag.json" 2>&1 | tail -2
    done
  done
  kill -INT $pid; sleep 3; kill -9 $pid 2>/dev/null
  grep -iE "warm|captured|compil" "$OUT/r/serve$tag.log" | cut -c1-200 | head -20
done
echo "done at $SECONDS s"
pack_results
