#!/usr/bin/env bash
# Issue 20's peer row under the per-step split: llama.cpp `-ncmoe` beside ours on the Flash-Next
# shape (16 layers) in the same machine lease, in two calls on one warm machine (carry `.whl` and
# `.peers`; the second call must follow the first within the machine's idle release):
#   PHASE=build OUT=$OUT bash bench/offload_peer_device.sh   # llama.cpp, ~6 minutes
#   PHASE=run   OUT=$OUT bash bench/offload_peer_device.sh   # ~8 minutes
# run: a random Q8_0 GGUF of the shape (`bench/peer_gguf.py`, ~27 GiB in /dev/shm),
# `llama-bench -ncmoe 0|8|13` (16 threads), then ours all on the device and with half and 80 %
# of the experts in host RAM, `--expert-cpu-share 0.5` and `auto`, and the peer table
# (`bench/offload_peer_table.py`) for each share.
source bench/device_env.sh
export PYTHONPATH=$PWD:/tmp/site LL=/tmp/ll
BIN=$LL/src/llama.cpp-0c1e57098/build/bin
if [ "${PHASE:-run}" = build ]; then
  bash .peers/llamacpp/build.sh
  exit
fi
[ -x "$BIN/llama-bench" ] || { echo "no llama-bench: run PHASE=build first"; exit 1; }
GGUF=/dev/shm/flash-next-16-q8_0.gguf
[ -f $GGUF ] || timeout 150 python3 bench/peer_gguf.py --arch qwen35moe --shape flash-next \
  --type q8_0 --layers 16 -o $GGUF > "$OUT/r/gguf.log" 2>&1
echo "gguf: $(ls -la $GGUF | awk '{print $5}') bytes at $SECONDS s"
for n in 0 8 13; do
  timeout 90 "$BIN/llama-bench" -m $GGUF -ngl 99 -fa 1 -t 16 -p 0 -n 64 -r 3 -ncmoe $n -o json \
    > "$OUT/r/llama-ncmoe-$n.json" 2> "$OUT/r/llama-ncmoe-$n.log"
  echo "llama -ncmoe $n: $(grep -o '"avg_ts": [0-9.]*' "$OUT/r/llama-ncmoe-$n.json") at $SECONDS s"
done
rm -f $GGUF  # (its RAM back for our host store)
timeout $(( $(left) - 20 )) python3 -u bench/expert_offload.py --layers 16 --steps 128 \
  --budget-s $(( $(left) - 80 )) --cpu-shares 0.5 auto --out "$OUT/r/eo-peer" \
  --only 0:stacked:uniform 0.5:tier:uniform 0.5:tier:skewed 0.8:tier:uniform 0.8:tier:skewed \
  > "$OUT/r/eo-peer.log" 2>&1
grep -E "B=1|routing|auto:" "$OUT/r/eo-peer.log" | tail -20
for share in 0.5 auto; do
  python3 bench/offload_peer_table.py --ours "$OUT/r/eo-peer.json" --cpu-share $share \
    --llama "$OUT"/r/llama-ncmoe-{0,8,13}.json --out "$OUT/r/offload-peer-cpu-$share" \
    && tail -4 "$OUT/r/offload-peer-cpu-$share.md"
done
pack_results r
