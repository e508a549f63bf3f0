"""The release launchers of the manual page exec ninfer-serve with their profile and env."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

RELEASE = Path(__file__).resolve().parents[2] / "scripts" / "release"


@pytest.fixture()
def current(tmp_path: Path) -> Path:
    for script in RELEASE.glob("*.sh"):
        shutil.copy2(script, tmp_path / script.name)
    fake = tmp_path / "ninfer-serve"
    fake.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    return tmp_path


def launch(current: Path, script: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("NINFER_")}
    return subprocess.run([str(current / script), *args], capture_output=True, text=True,
                          env={**clean, **env}, timeout=30)


def test_flash_next_wrapper_passes_profile_env_and_extra_flags(current):
    out = launch(current, "serve-flash-next.sh", "/models/x.ninfer", "--port", "9999",
                 NINFER_HOST="127.0.0.2", NINFER_PORT="8081", NINFER_DEVICES="1,2",
                 NINFER_MAX_CONTEXT="65536", NINFER_MODEL_ID="capy", NINFER_VISION="0")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:-1] == [
        "/models/x.ninfer", "--profile", "flash-next", "--host", "127.0.0.2", "--port", "8081",
        "--devices", "1,2", "--max-context", "65536", "--model-id", "capy", "--no-vision",
        "--port", "9999"]


def test_tp2_wrapper_uses_the_27b_profile_and_vision_switch(current):
    out = launch(current, "serve-tp2.sh", "/m.ninfer", NINFER_VISION="1")
    assert out.stdout.split() == ["/m.ninfer", "--profile", "27b", "--vision"]


def test_wrapper_without_artifact_keeps_flags(current):
    out = launch(current, "serve-tp2.sh", "--no-tui")
    assert out.stdout.split() == ["--profile", "27b", "--no-tui"]


def test_wrapper_rejects_bad_vision_value(current):
    out = launch(current, "serve-tp2.sh", "/m.ninfer", NINFER_VISION="yes")
    assert out.returncode == 1 and "NINFER_VISION must be 0 or 1" in out.stderr
