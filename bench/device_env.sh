# Sourced by the one-call device scripts (bench/*_device.sh), from the repository root: the
# wheels the H200 image lacks into /tmp/site (`.whl/` from `bash scripts/device_wheels.sh`;
# each command puts its tree and /tmp/site on PYTHONPATH), OUT and NINFER_HOME, the seconds
# left of the call (`left`), and the GPU tests (`gpu_tests`).
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1
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
