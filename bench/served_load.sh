#!/usr/bin/env bash
# Served load on one GPU: ninfer-serve and llama-server on the same shape (random weights),
# under the same load (the peers' serve_load.py: streamed chat, TTFT, per-stream and aggregate
# tok/s at each concurrency level), in two device calls on one warm machine:
#   bench/served_load.sh build   llama.cpp's llama-server (build.sh, ~6 min on 16 cores), our
#                                artifact (`ninfer synth`) and the peer's GGUF, into /dev/shm
#   bench/served_load.sh serve   each server in turn under the load; JSON per server in $OUT
# Needs in the checkout (git-ignored; `bash scripts/device_wheels.sh` makes both): .peers/ =
# ../shared/peers/{llamacpp,serve_load.py}; .whl/ = the wheels the H200 image lacks. OLD=DIR
# also serves an older tree (ninfer_engine, ninfer_http, ninfer_tui from `git archive`) under
# the same load, as "before".
# Each ninfer server also gets bench/serve_staggered.py (arrivals spread in time: prompts keep
# arriving while the other streams decode). PEER=0 skips llama.cpp (build and serve).
# SERVERS (default "after before llama") picks which servers `serve` runs, so a lease can split
# them over calls; "before" runs only with OLD, "llama" only without PEER=0. NINFER_FLAGS: more
# ninfer-serve flags for the ninfer servers (e.g. --prefill-chunk 8192).
# LONG_LOAD (serve_load.py flags, e.g. 1K-token prompts: --prompt-chars 4300) runs each server
# once more under that load, into served-$ARCH-<server>-long.json (TTFT with long prompts), and
# measures TTFT p50/p99 of 1K-token prompts arriving one at a time and 8 together
# (serve_staggered.py --burst, burst-$ARCH-<server>-c1|c8.json) and, arriving spread in time,
# the gaps between the decoding streams' tokens (staggered-$ARCH-<server>-long.json);
# LLAMA_LONG=0 skips these for llama-server.
# `serve` starts with the engine's own step on the same shape (`ninfer bench --sampling served`,
# engine-$ARCH.json; ENGINE=0 skips it): first, so that its Triton compiles fill the disk cache
# before any server starts (the first server on a fresh machine otherwise compiled what later
# ones found cached, and lost an after/before comparison to run order). It ends by packing
# every file of $OUT into served-$ARCH.tgz (the device tool brings back at most 8 files; PACK=0
# leaves them loose).
set -o pipefail
OUT=${OUT:-bench/results}
ARCH=${ARCH:-35b-a3b}; LAYERS=${LAYERS:-8}; RECIPE=${RECIPE:-fp8-row}; GGUF_TYPE=${GGUF_TYPE:-q8_0}
LOAD=${LOAD:---concurrency 1,8 --requests 32 --max-tokens 256 --prompt-chars 430 --ignore-eos}
MODEL=/dev/shm/ninfer-$ARCH-$LAYERS-$RECIPE.ninfer
GGUF=/dev/shm/llama-$ARCH-$LAYERS-$GGUF_TYPE.gguf
LLAMA=/tmp/ll/src/llama.cpp-0c1e57098/build/bin
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
case $ARCH in 35b-a3b) peer="--arch qwen35moe --shape 35b-a3b" ;; 27b) peer="--arch qwen35 --shape 27b" ;; esac

wait_health() {  # url, pid, seconds
  for _ in $(seq "$3"); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 1
  done
  return 1
}

long_load() {  # url, label
  [ -n "${LONG_LOAD:-}" ] || return 0
  python3 .peers/serve_load.py "$1" bench $LONG_LOAD --label "$2-long" \
    --json "$OUT/served-$ARCH-$2-long.json" 2>&1 | tee -a "$OUT/served.log"
}

ttft_bursts() {  # url, label: TTFT p50/p99 of LONG_LOAD-sized prompts, one then 8 arriving together
  [ -n "${LONG_LOAD:-}" ] || return 0
  # and arriving spread in time: what each long prompt's steps cost the streams decoding
  python3 bench/serve_staggered.py "$1" bench --concurrency 8 --requests 32 --max-tokens 128 \
    --prompt-chars 4300 --label "$2-staggered-long" \
    --json "$OUT/staggered-$ARCH-$2-long.json" 2>&1 | tee -a "$OUT/served.log"
  for c in 1 8; do
    python3 bench/serve_staggered.py "$1" bench --burst --concurrency $c --requests 16 \
      --max-tokens 64 --prompt-chars 4300 --label "$2-burst$c" \
      --json "$OUT/burst-$ARCH-$2-c$c.json" 2>&1 | tee -a "$OUT/served.log"
  done
}

serve_ninfer() {  # label, PYTHONPATH prefix
  local port=18080 log="$OUT/serve-$1.log"
  # -P: the checkout (the working directory) is not put first on the path, so OLD's tree is
  # the one imported (without it, "before" ran this checkout's code)
  PYTHONPATH="${2:-$PWD}${PYTHONPATH:+:$PYTHONPATH}" setsid python3 -P -m ninfer_tui.cli "$MODEL" --no-tui \
    --host 127.0.0.1 --port $port --model-id bench --max-concurrency 8 --max-context 8192 \
    --kv-capacity 65536 --log-stats-interval-ms 1000 ${NINFER_FLAGS:-} > "$log" 2>&1 &
  local pid=$!
  if wait_health http://127.0.0.1:$port $pid 300; then
    python3 .peers/serve_load.py http://127.0.0.1:$port bench $LOAD --label "ninfer-$1" \
      --json "$OUT/served-$ARCH-ninfer-$1.json" 2>&1 | tee -a "$OUT/served.log"
    python3 bench/serve_staggered.py http://127.0.0.1:$port bench --concurrency 8 --requests 48 \
      --max-tokens 256 --prompt-chars 430 --label "ninfer-$1" \
      --json "$OUT/staggered-$ARCH-ninfer-$1.json" 2>&1 | tee -a "$OUT/served.log"
    long_load http://127.0.0.1:$port "ninfer-$1"
    ttft_bursts http://127.0.0.1:$port "ninfer-$1"
  else
    echo "ninfer-$1 did not become healthy" | tee -a "$OUT/served.log"; tail -5 "$log"
  fi
  kill -INT $pid; sleep 3; kill -9 $pid 2>/dev/null
}

serve_llama() {
  local port=18081
  setsid "$LLAMA/llama-server" -m "$GGUF" -ngl 99 -fa on -np 8 -c 65536 --host 127.0.0.1 \
    --port $port > "$OUT/serve-llama.log" 2>&1 &
  local pid=$!
  if wait_health http://127.0.0.1:$port $pid 300; then
    python3 .peers/serve_load.py http://127.0.0.1:$port bench $LOAD --label llama-server \
      --json "$OUT/served-$ARCH-llama-server.json" 2>&1 | tee -a "$OUT/served.log"
    if [ "${LLAMA_LONG:-1}" != 0 ]; then
      long_load http://127.0.0.1:$port llama-server
      ttft_bursts http://127.0.0.1:$port llama-server
    fi
  else
    echo "llama-server did not become healthy" | tee -a "$OUT/served.log"
  fi
  kill $pid; sleep 2; kill -9 $pid 2>/dev/null
}

engine_step() {  # the engine's own step on the same shape, as served requests sample
  timeout 300 python3 -m ninfer_engine.cli.tools bench --arch "$ARCH" --layers "$LAYERS" \
    --context 1024 --weights "$RECIPE" --concurrency 1,8 --prefill 0 --spec-rates none \
    --no-peer --sampling served --out "$OUT/engine-$ARCH.json" > "$OUT/engine.log" 2>&1
  grep -E "^\| (1|8) " "$OUT/engine.log" | tee -a "$OUT/served.log"
}

pack() {  # one file back: the device tool returns at most 8
  (cd "$OUT" && tar czf "served-$ARCH.tgz" --exclude "served-$ARCH.tgz" ./* \
    && find . -maxdepth 1 -type f ! -name "served-$ARCH.tgz" -delete)
}

case $1 in
  build)
    build=
    if [ "${PEER:-1}" != 0 ]; then
      bash .peers/llamacpp/build.sh > "$OUT/llama-build.log" 2>&1 &
      build=$!
    fi
    python3 -m ninfer_engine.cli.tools synth --arch "$ARCH" --layers "$LAYERS" --recipe "$RECIPE" \
      --device cuda -o "$MODEL" > "$OUT/synth.log" 2>&1 || tail -5 "$OUT/synth.log"
    if [ -n "$build" ]; then
      python3 .peers/llamacpp/make_gguf.py $peer --type "$GGUF_TYPE" --layers "$LAYERS" \
        -o "$GGUF" > "$OUT/gguf.log" 2>&1 || tail -5 "$OUT/gguf.log"
      wait $build; tail -3 "$OUT/llama-build.log"
    fi
    ls -la /dev/shm ;;
  serve)
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$OUT/nvidia-smi.csv"
    servers=" ${SERVERS:-after before llama} "
    [ "${ENGINE:-1}" != 0 ] && engine_step
    [[ $servers == *" after "* ]] && serve_ninfer after ""
    [[ $servers == *" before "* && -n "${OLD:-}" ]] && serve_ninfer before "$OLD"
    [[ "${PEER:-1}" != 0 && $servers == *" llama "* ]] && serve_llama
    if [ "${PACK:-1}" != 0 ]; then pack; fi ;;  # (as `[ ] && pack`, PACK=0 exited 1)
  *) echo "usage: bench/served_load.sh build|serve" >&2; exit 1 ;;
esac
