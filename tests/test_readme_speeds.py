"""README's speed table is generated from bench/results: it must not drift from the files."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_speed_table_matches_the_result_files():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "readme_table.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, "run `python bench/readme_table.py` and commit README.md"
