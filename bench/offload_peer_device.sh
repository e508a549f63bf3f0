#!/usr/bin/env bash
# Issue 20's peer row under the per-step split: llama.cpp `-ncmoe` beside ours on the Flash-Next
# shape (16 layers) in the same machine lease. With llama-bench built ahead
# (`scripts/llama_prebuilt.sh`), `run`: its tarball with `.whl-bench` and
# `.peers/llamacpp/make_gguf.py` is over the device tool's 64 MiB with the tracked tree (it
# counts disk blocks: 65.3 MiB on 12-07), so a first call carries `.peers/llama-bin.tar.xz`
# alone (`tar xJf .peers/llama-bin.tar.xz -C /tmp`: it stays for the next call on the warm
# machine) and the second `.whl-bench` and `.peers/llamacpp/make_gguf.py` (not yet tried);
# else (no prebuilt) two calls on one warm machine (carry `.whl` and `.peers`; the second must
# follow the first within the idle release):
#   PHASE=build OUT=$OUT bash bench/offload_peer_device.sh   # ~7 minutes
#   PHASE=run   OUT=$OUT bash bench/offload_peer_device.sh   # ~9 minutes
# build: llama.cpp built for this host's CPU (`GGML_NATIVE=ON`, as the earlier peer rows; the
# shared script builds a generic CPU backend) while the expert tier's CUDA tests (and the llama
# static step's) run and a random Q8_0 GGUF of the shape is written (`bench/peer_gguf.py`,
# ~27 GiB in /dev/shm); then `llama-bench -ncmoe 0|8|13` (16 threads) as far as the call allows.
# run: the llama-bench runs still missing, then ours all on the device and with half and 80 %
# of the experts in host RAM, `--expert-cpu-share` 0.5 and `auto`, and the peer table
# (`bench/offload_peer_table.py`) for each share. A short call: NCMOE="0 8" SHARES=auto
# ONLY="0:stacked:uniform 0.5:tier:uniform 0.5:tier:skewed" (the defaults: all of the above).
source bench/device_env.sh
export PYTHONPATH=$PWD:/tmp/site LL=/tmp/ll
BIN=$LL/src/llama.cpp-0c1e57098/build/bin
GGUF=/dev/shm/flash-next-16-q8_0.gguf
[ -f .peers/llama-bin.tar.xz ] && tar xJf .peers/llama-bin.tar.xz -C /tmp
if [ -x /tmp/llama-bin/llama-bench ]; then  # built ahead (scripts/llama_prebuilt.sh): no build
  BIN=/tmp/llama-bin PHASE=run
  CU13=$(python3 -c "import nvidia.cu13 as c; print(list(c.__path__)[0])")/lib  # (torch's cuBLAS)
  export LD_LIBRARY_PATH=$BIN:$CU13:$LD_LIBRARY_PATH
fi
write_gguf() {
  [ -f $GGUF ] || timeout 300 python3 bench/peer_gguf.py --arch qwen35moe --shape flash-next \
    --type q8_0 --layers 16 -o $GGUF > "$OUT/r/gguf.log" 2>&1
  echo "gguf: $(ls -la $GGUF | awk '{print $5}') bytes at $SECONDS s"
}
llama_bench() {  # each -ncmoe not yet measured, while the call has time for one
  for n in ${NCMOE:-0 8 13}; do
    [ -s "$OUT/r/llama-ncmoe-$n.json" ] || [ -s "/tmp/llama-ncmoe-$n.json" ] && continue
    [ "$(left)" -gt 100 ] || return
    timeout 90 "$BIN/llama-bench" -m $GGUF -ngl 99 -fa 1 -t 16 -p 0 -n 64 -r 3 -ncmoe $n \
      -o json > "/tmp/llama-ncmoe-$n.json" 2> "$OUT/r/llama-ncmoe-$n.log"
    cp "/tmp/llama-ncmoe-$n.json" "$OUT/r/"
    echo "llama -ncmoe $n: $(grep -o '"avg_ts": [0-9.]*' "/tmp/llama-ncmoe-$n.json") at $SECONDS s"
  done
}
if [ "${PHASE:-run}" = build ]; then
  # (a copy outside the carried folder, which may arrive read-only, pointed back at its tarball)
  sed -e 's/-DGGML_NATIVE=OFF/-DGGML_NATIVE=ON/' -e "s|^here=.*|here=$PWD/.peers/llamacpp|" \
    .peers/llamacpp/build.sh > /tmp/native.sh
  (bash /tmp/native.sh > "$OUT/r/llama-build.log" 2>&1) &
  built=$!
  gpu_tests 150 tests/experts/test_host_jobs.py tests/kernels/test_host_handoff.py \
    tests/experts/test_cuda_tiers.py tests/experts/test_cost_model.py \
    tests/engine/test_decode_graphs.py
  write_gguf
  wait $built
  echo "llama.cpp built (rc $?) at $SECONDS s: $(tail -2 "$OUT/r/llama-build.log" | tr '\n' ' ')"
  llama_bench
  pack_results r
  exit
fi
[ -x "$BIN/llama-bench" ] || { echo "no llama-bench: run PHASE=build first"; exit 1; }
write_gguf
llama_bench
cp /tmp/llama-ncmoe-*.json "$OUT/r/" 2>/dev/null
rm -f $GGUF  # (its RAM back for our host store)
timeout $(( $(left) - 20 )) python3 -u bench/expert_offload.py --layers 16 --steps 128 \
  --budget-s $(( $(left) - 80 )) --cpu-shares ${SHARES:-0.5 auto} --out "$OUT/r/eo-peer" \
  --only ${ONLY:-0:stacked:uniform 0.5:tier:uniform 0.5:tier:skewed 0.8:tier:uniform \
  0.8:tier:skewed} > "$OUT/r/eo-peer.log" 2>&1
grep -E "B=|routing|auto:" "$OUT/r/eo-peer.log" | tail -30
grep -q Traceback "$OUT/r/eo-peer.log" && tail -6 "$OUT/r/eo-peer.log"
for share in ${SHARES:-0.5 auto}; do
  python3 bench/offload_peer_table.py --ours "$OUT/r/eo-peer.json" --cpu-share $share \
    --llama $(ls "$OUT"/r/llama-ncmoe-*.json) --out "$OUT/r/offload-peer-cpu-$share" \
    && tail -4 "$OUT/r/offload-peer-cpu-$share.md"
done
pack_results r
