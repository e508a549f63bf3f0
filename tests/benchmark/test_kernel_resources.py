"""`bench/kernel_resources.py`: a GDN launch compiled for sm_90 without a GPU, its cubin's
registers, spills and shared memory read back and written as JSON and a table."""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_solve_launches_are_compiled_and_read(tmp_path):
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "kernel_resources.py"),
                           "--out", str(tmp_path), "--only", "solve"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads((tmp_path / "sm90-prompt-kernel-resources.json").read_text())["rows"]
    assert [r["variant"]["warps"] for r in rows] == [1, 2, 4]
    assert [r["engine"] for r in rows] == [True, False, False]
    for r in rows:
        assert 0 < r["registers"] <= 255 and r["spill_bytes"] >= 0 and r["shared_bytes"] > 0
    table = (tmp_path / "sm90-prompt-kernel-resources.md").read_text()
    assert "| solve | warps 1 (engine) |" in table
