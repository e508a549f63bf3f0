"""What every benchmark script writes: the machine it ran on and its result files.

`write_report(out, result, markdown)` writes `out.json` and `out.md` (any `.json` on `out` is
dropped first; other dots stay, so `cpu-0.8b` keeps its name) and prints the markdown.
"""
from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable
from pathlib import Path

import torch


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_machine(**extra) -> dict:
    """The CPU, its cores, torch and its thread count, Python, plus `extra` fields."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            **extra}


def write_report(out: Path, result: dict, markdown: Callable[[dict], str]) -> None:
    stem = str(out)[: -len(".json")] if str(out).endswith(".json") else str(out)
    Path(stem).parent.mkdir(parents=True, exist_ok=True)
    text = markdown(result)
    Path(f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    Path(f"{stem}.md").write_text(text)
    print(text)
