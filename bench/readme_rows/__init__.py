"""README's speed-table rows by area (`bench/readme_table.py` joins them): each module's
`*_rows()` reads committed `bench/results/*.json` files and returns markdown rows; a missing
file drops its rows."""
from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"


def load(name: str) -> dict | None:
    """`bench/results/NAME` parsed, or None where it is not there."""
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None
