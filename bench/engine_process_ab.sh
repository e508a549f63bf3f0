#!/usr/bin/env bash
# The engine in its own process against the engine in the HTTP process: the same tree served
# three times in one call (NINFER_ENGINE_PROCESS=1, 0, 1) under the same load, then the engine's
# own step. Usage on the device: bench/engine_process_ab.sh LAYERS (35B-A3B shape, fp8-row).
# Needs .whl/ (bench/served_load.sh's wheels) and .peers/serve_load.py; results in /tmp/ab, packed
# into $OUT/ab.tgz (bench/results/h200-engine-process.md was written from them).
D=/tmp/ab; mkdir -p $D
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site
L=$1; M=/dev/shm/ninfer-35b-a3b-$L-fp8-row.ninfer
t0=$(date +%s); timeout 300 python3 -m ninfer_engine.cli.tools synth --arch 35b-a3b --layers $L --recipe fp8-row --device cuda -o $M > $D/synth.log 2>&1; echo "synth $(( $(date +%s)-t0 )) s"
run() {  # label, NINFER_ENGINE_PROCESS
  port=18100
  NINFER_ENGINE_PROCESS=$2 setsid python3 -m ninfer_tui.cli $M --no-tui --host 127.0.0.1 --port $port --model-id bench --max-concurrency 8 --max-context 8192 --kv-capacity 65536 --log-stats-interval-ms 1000 > $D/serve-$1.log 2>&1 &
  pid=$!
  for i in $(seq 240); do curl -sf http://127.0.0.1:$port/health >/dev/null && break; sleep 1; done
  python3 .peers/serve_load.py http://127.0.0.1:$port bench --concurrency 1,8 --requests 32 --max-tokens 256 --prompt-chars 430 --ignore-eos --label $1 --json $D/served-$1.json 2>&1 | grep -E "C=|Error" 
  python3 bench/serve_staggered.py http://127.0.0.1:$port bench --concurrency 8 --requests 48 --max-tokens 256 --prompt-chars 430 --label $1 --json $D/staggered-$1.json > /dev/null 2>&1; python3 -c "import json;d=json.load(open('$D/staggered-$1.json'));print('$1 staggered', round(d['aggregate_tok_s']), 'ttft p50/p99', round(d['ttft_median_s']*1e3), round(d['ttft_p99_s']*1e3))"
  kill -INT $pid; sleep 4; kill -9 $pid 2>/dev/null; pkill -9 -f "multiprocessing.spawn" 2>/dev/null; sleep 1
}
run process 1; run inproc 0; run process2 1
timeout 100 python3 -m ninfer_engine.cli.tools bench --arch 35b-a3b --layers $L --context 1024 --weights fp8-row --concurrency 1,8 --prefill 0 --spec-rates none --no-peer --sampling served --out $D/bench-served.json > $D/bench-served.log 2>&1; grep -E "^\| (1|8) " $D/bench-served.log
tar czf $OUT/ab.tgz -C /tmp ab
