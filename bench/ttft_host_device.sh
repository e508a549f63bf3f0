#!/usr/bin/env bash
# Where issue 18's burst TTFT spends host time, in one call: the engine's 8x955 and 1x955 prompt
# bursts traced with Python stacks (TRACE=1, the default: bench/prompt_burst.py --trace;
# bench/trace_gaps.py charges the device's idle time to the host's functions), then the served
# burst (ttft_burst_device.sh) with this tree's prompt encoder and each carried one of ENCODERS
# (prompt_encoder.py variants) in turn, PASSES times (default 1), server N's files in
# $OUT/runN; with DEEP=1 last the 40-layer shape's served burst on this tree ($OUT/deep).
# LIGHT=1 traces without Python stacks (`--trace-light`: the host at near its real speed).
# Everything but the traces comes back in one tarball.
#   OUT=/tmp/o ENCODERS=".old-enc/a.py" [PASSES=2] [TRACE=0] [DEEP=1] bash bench/ttft_host_device.sh
source bench/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p "$OUT/t"
if [ "${TRACE:-1}" = 1 ]; then
  PYTHONPATH=$PWD:/tmp/site timeout 240 python3 -u bench/prompt_burst.py --layers 8 --served \
    --prefix-reuse --prefill-chunk 8192 --bursts 1x955,8x955,8x955,1x955,8x955 \
    --trace 8x955,1x955 ${LIGHT:+--trace-light} --trace-dir "$OUT" > "$OUT/t/burst.log" 2>&1
  grep -E "^(1|8)x955|engine built|trace of" "$OUT/t/burst.log"
  for spec in 8x955 1x955; do
    python3 bench/trace_gaps.py "$OUT/trace-$spec.json.gz" --top 80 > "$OUT/t/gaps-$spec.txt" 2>&1
    grep -E "^burst step" "$OUT/t/gaps-$spec.txt"
  done
  echo "traced at $SECONDS s"
fi
cp ninfer_http/prompt_encoder.py /tmp/prompt_encoder.py
n=0
for pass in $(seq "${PASSES:-1}"); do
  for enc in tree $ENCODERS; do
    n=$((n + 1))
    [ "$(left)" -gt 100 ] || { echo "$enc: no time left"; break 2; }
    echo "pass $pass, encoder $enc -> run$n at $SECONDS s"
    if [ "$enc" = tree ]; then cp /tmp/prompt_encoder.py ninfer_http/prompt_encoder.py
    else cp "$enc" ninfer_http/prompt_encoder.py; fi
    mkdir -p "$OUT/run$n"
    OUT=$OUT/run$n ROUNDS=${ROUNDS:-2} bash bench/ttft_burst_device.sh
  done
done
cp /tmp/prompt_encoder.py ninfer_http/prompt_encoder.py
if [ "${DEEP:-0}" = 1 ] && [ "$(left)" -gt 200 ]; then
  echo "40 layers at $SECONDS s"
  mkdir -p "$OUT/deep"
  OUT=$OUT/deep LAYERS=40 ROUNDS=${ROUNDS:-2} timeout $(( $(left) - 15 )) \
    bash bench/ttft_burst_device.sh
fi
tar czf "$OUT/all.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d t run* deep 2>/dev/null) \
  && (cd "$OUT" && rm -rf t run* deep)
echo "done at $SECONDS s"
