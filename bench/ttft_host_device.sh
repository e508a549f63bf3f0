#!/usr/bin/env bash
# Where issue 18's burst TTFT spends host time, in one call: the engine's 8x955 and 1x955 prompt
# bursts traced with Python stacks (bench/prompt_burst.py --trace; bench/trace_gaps.py charges
# the device's idle time to the host's functions), then the served burst (ttft_burst_device.sh)
# with this tree's prompt encoder, then with each carried one of ENCODERS (prompt_encoder.py
# variants, each run into $OUT/encN) in turn. Everything but the traces comes back in one
# tarball.
#   OUT=/tmp/o ENCODERS=".old-enc/a.py .old-enc/b.py" bash bench/ttft_host_device.sh
source bench/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p "$OUT/t"
PYTHONPATH=$PWD:/tmp/site timeout 240 python3 -u bench/prompt_burst.py --layers 8 --served \
  --prefix-reuse --prefill-chunk 8192 --bursts 1x955,8x955,8x955,1x955,8x955 \
  --trace 8x955,1x955 --trace-dir "$OUT" > "$OUT/t/burst.log" 2>&1
grep -E "^(1|8)x955|engine built|trace of" "$OUT/t/burst.log"
for spec in 8x955 1x955; do
  python3 bench/trace_gaps.py "$OUT/trace-$spec.json.gz" --top 80 > "$OUT/t/gaps-$spec.txt" 2>&1
  grep -E "^burst step" "$OUT/t/gaps-$spec.txt"
done
echo "traced at $SECONDS s"
ROUNDS=${ROUNDS:-2} bash bench/ttft_burst_device.sh
cp ninfer_http/prompt_encoder.py /tmp/prompt_encoder.py
n=0
for enc in $ENCODERS; do
  n=$((n + 1))
  [ "$(left)" -gt 100 ] || { echo "$enc: no time left"; break; }
  echo "encoder $enc -> enc$n"
  cp "$enc" ninfer_http/prompt_encoder.py
  mkdir -p "$OUT/enc$n"
  OUT=$OUT/enc$n ROUNDS=${ROUNDS:-2} bash bench/ttft_burst_device.sh
done
cp /tmp/prompt_encoder.py ninfer_http/prompt_encoder.py
tar czf "$OUT/all.tar.gz" -C "$OUT" $(cd "$OUT" && ls -d t r r.tar.gz enc* 2>/dev/null) \
  && (cd "$OUT" && rm -rf t r r.tar.gz enc[0-9]*)
echo "done at $SECONDS s"
