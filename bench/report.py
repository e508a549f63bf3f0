"""What every benchmark script writes: the machine it ran on and its result files.

`write_report(out, result, markdown)` writes `out.json` and `out.md` (any `.json` on `out` is
dropped first; other dots stay, so `cpu-0.8b` keeps its name) and prints the markdown.
`ForeignLoad` measures how busy other processes kept the CPU while a benchmark ran.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
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


META = ("title", "machine", "date", "tree", "command")


def table_parser(doc: str, title: str | None = None) -> argparse.ArgumentParser:
    """The command line of a script that tables one device call's files: their folder, `--out`,
    the header flags (`META`: required, but `--title` where `title` is its default) and
    `--note`s."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    for key in META:
        default = title if key == "title" else None
        ap.add_argument(f"--{key}", required=default is None, default=default)
    ap.add_argument("--note", action="append", default=[])
    return ap


def meta_of(args) -> dict:
    """The header `add_meta_args` parsed, its notes under `notes`."""
    return {**{k: getattr(args, k) for k in META}, "notes": args.note}


def meta_lines(meta: dict) -> list[str]:
    """A table's title and header lines in markdown."""
    return [f"# {meta['title']}", "", *(f"- {k}: {meta[k]}" for k in META[1:]), ""]


def note_lines(meta: dict) -> list[str]:
    """A table's notes in markdown, after a blank line (none: nothing)."""
    return ["", *meta["notes"]] if meta.get("notes") else []


class ForeignLoad:
    """`with ForeignLoad() as load:` — afterwards `load.cores` is the CPU other processes used
    while the block ran, in cores (~0: quiet; ~1: one core busy elsewhere), None off Linux.
    On a 2-core box one busy core halves torch's 2-thread speed or worse, and the load average
    cannot tell that apart from the benchmark's own threads."""

    cores: float | None = None

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        except (OSError, ValueError):
            return None
        busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
        ours = os.times()
        return busy / os.sysconf("SC_CLK_TCK"), ours.user + ours.system, time.monotonic()

    def __enter__(self) -> ForeignLoad:
        self._start = self._sample()
        return self

    def __exit__(self, *exc) -> None:
        end = self._sample()
        if self._start is not None and end is not None and end[2] > self._start[2]:
            busy, ours, wall = (e - s for e, s in zip(end, self._start))
            self.cores = max(0.0, (busy - ours) / wall)


def speculation_counts(before, after) -> dict:
    """A run's speculation figures from two `speculator.stats()` snapshots around it."""
    rounds, drafted = after.rounds - before.rounds, after.drafted - before.drafted
    accepted = after.accepted - before.accepted
    return dict(rounds=rounds, drafted=drafted, accepted=accepted,
                acceptance=accepted / drafted if drafted else 0.0,
                tokens_per_round=1 + accepted / rounds if rounds else 0.0)
