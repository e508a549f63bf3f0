#!/usr/bin/env bash
# `ninfer bench` on one H200 for the committed result files (bench/results/h200-ninfer-bench-*;
# on an H100 they are named h100-ninfer-bench-*):
# Every figure is the serving engine's own step (`Engine.step`), speculative verify rows included
# (the oracle drafter at 3.67 and 2.4 tokens a round, k = 3, at B = 1 and 8).
#   27b          bf16: decode at 1K/8K/32K, concurrency 1/2/4/8, 8K prefill, transformers peer
#   35b-a3b      bf16: the same, with the transformers peer
#   35b-a3b-fp8  `--weights fp8-row` (routed experts fp8 as stored): the same, no peer
#   35b-a3b-fp8-nospec  the same without the speculative section, so the engine captures no
#                verify graphs (max_q 1): does the decode step pay for the verify trail?
#   27b-16l-b8   the 27B cut to 16 layers at concurrency 8, the shape `served_load.sh` serves
#                (served aggregate against the engine's own figure)
#   27b-spec     bf16 at 1K, B = 1 and 8, the speculative section drafting with a random MTP
#                head (`--spec-drafter mtp`): issue 19's 27B figure at 3.67 tokens a round
#   27b-spec-shortlist  the same, the drafts' argmax over the head's first 131,072 rows
#                (`--lm-head-draft`, as a `--spec mtp --lm-head-draft` server drafts)
#   27b-fp8      `--weights fp8-row`: decode and concurrency (no prefill, no peer)
#   27b-q4       `--weights qwen3_6_27b` (the official Q4/Q5 mix, head Q6) served as the engine's
#                default `--cuda-weights auto` does (Q4/Q5 repacked into fp8 groups): the same
#   27b-q4-packed  the same recipe kept packed as stored (`--cuda-weights packed`)
#   flash-next-fp8 `--arch flash-next --weights fp8-row` (Qwen3-Next-80B-A3B class: ~80 GB with
#                the routed experts served fp8, where bf16 would need ~160 GB and is refused):
#                decode, concurrency and the 8K prefill, no peer (it would not fit in bf16)
# Arguments pick some of these by name (default: all). Run from the repository root with OUT
# set to the output folder; no network needed. The
# wheels in .whl/ are installed --no-deps into a private folder on PYTHONPATH (their
# dependencies must already be importable; if not, the peer sections record why).
# Each run has a time budget (about 12 minutes in all); a run stopped while timing the peer still
# leaves its JSON (the peer then listed under not_measured). Progress goes to stderr.
set -u
OUT=${OUT:?set OUT to the output folder}
PY=${PYTHON:-python3}
mkdir -p "$OUT" bench/results
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
log() { echo "[$(date +%T) +${SECONDS}s] $*" >&2; }

# every wheel of .whl/ (the engine's own dependencies the device image lacks, llguidance
# among them, and transformers for the peer) into a private folder on PYTHONPATH
PEERLIB=${TMPDIR:-/tmp}/ninfer-peer-lib
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install --quiet --no-deps --no-index --target "$PEERLIB" .whl/*.whl >&2 \
        || log "installing .whl/ failed"
    export PYTHONPATH="$PEERLIB${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c 'import sys, transformers as t; print("transformers", t.__version__, file=sys.stderr)' \
    || log "transformers is not importable: the peer sections will record the reason"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader >&2 || true
# the result files are named for the machine that ran them: h200-…, or h100-… on an H100
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
  *H100*) MACHINE=h100 ;;
  *) MACHINE=h200 ;;
esac

# run NAME BUDGET_S ARGS...: bench/results/NAME.{json,md} (+ .log), copied to $OUT
run() {
    local name=${1/#h200-/$MACHINE-} budget=$2
    shift 2
    log "start $name (budget ${budget}s): ninfer bench $*"
    touch "$OUT/.start-$name"  # only files written after this are copied (not stale ones)
    timeout --kill-after=15 "$budget" "$PY" -m ninfer_engine.cli.tools bench "$@" \
        --out "bench/results/$name.json" --markdown "bench/results/$name.md" \
        2> >(tee "$OUT/$name.log" >&2) > /dev/null
    local rc=$?
    [ $rc -eq 124 ] && log "$name ran past its ${budget}s budget"
    for f in "bench/results/$name.json" "bench/results/$name.md"; do
        if [ "$f" -nt "$OUT/.start-$name" ]; then cp "$f" "$OUT/"; else log "no new $f"; fi
    done
    rm -f "$OUT/.start-$name"
    log "end $name (exit $rc)"
}

ALL=(--context 1024,8192,32768 --concurrency 1,2,4,8 --concurrency-context 1024)
PEER=(--prefill 8192 --prefill-chunk 4096 --peer transformers --peer-prompt 1024
      --peer-steps 64)  # 16 steps varied 7.0-8.7 tok/s between runs (27B)
for which in "${@:-27b 35b-a3b 35b-a3b-fp8 27b-fp8 27b-q4 27b-q4-packed flash-next-fp8}"; do
  for one in $which; do
    case $one in
      27b) run h200-ninfer-bench-27b 200 --arch 27b --weights bf16 "${ALL[@]}" "${PEER[@]}" ;;
      35b-a3b) run h200-ninfer-bench-35b-a3b 200 --arch 35b-a3b --weights bf16 "${ALL[@]}" \
                 "${PEER[@]}" ;;
      35b-a3b-fp8) run h200-ninfer-bench-35b-a3b-fp8 150 --arch 35b-a3b --weights fp8-row \
                     "${ALL[@]}" --prefill 8192 --no-peer ;;
      35b-a3b-fp8-nospec) run h200-ninfer-bench-35b-a3b-fp8-nospec 90 --arch 35b-a3b \
                            --weights fp8-row --context 1024 --concurrency 1,8 \
                            --spec-rates none --prefill 0 --no-peer ;;
      27b-16l-b8) run h200-ninfer-bench-27b-16l 90 --arch 27b --layers 16 --context 1024 \
                    --concurrency 8 --spec-rates none --prefill 0 --no-peer ;;
      27b-spec) run h200-ninfer-bench-27b-spec 200 --arch 27b --weights bf16 --context 1024 \
                  --concurrency 1,8 --spec-drafter mtp --prefill 0 --no-peer ;;
      27b-spec-shortlist) run h200-ninfer-bench-27b-spec-shortlist 200 --arch 27b --weights bf16 \
                  --context 1024 --concurrency 1,8 --spec-drafter mtp --lm-head-draft 131072 \
                  --prefill 0 --no-peer ;;
      27b-fp8) run h200-ninfer-bench-27b-fp8 95 --arch 27b --weights fp8-row "${ALL[@]}" \
                 --prefill 0 --no-peer ;;
      27b-q4) run h200-ninfer-bench-27b-q4 95 --arch 27b --weights qwen3_6_27b "${ALL[@]}" \
                --prefill 0 --no-peer ;;
      27b-q4-packed) run h200-ninfer-bench-27b-q4-packed 95 --arch 27b --weights qwen3_6_27b \
                       --cuda-weights packed "${ALL[@]}" --prefill 0 --no-peer ;;
      flash-next-fp8) run h200-ninfer-bench-flash-next-fp8 150 --arch flash-next \
                        --weights fp8-row "${ALL[@]}" --prefill 8192 --prefill-chunk 4096 \
                        --no-peer ;;
      *) log "unknown run $one" ;;
    esac
  done
done
log "done; files in $OUT:"
ls -l "$OUT" >&2
