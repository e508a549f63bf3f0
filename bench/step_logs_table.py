"""`bench/profile_step.py` logs of one device call as a results table (JSON + markdown).

    python3 bench/step_logs_table.py DIR --out bench/results/NAME --title T --machine M \
        --date D --tree SHA --command C [--note TEXT]... [--runs a,b,...]

DIR holds the call's `step-NAME.log` files (`device_env.sh`'s `profile_step NAME ...`); each
run's row: the sampling it served, the engine step (`Engine.step`, CUDA-event timed), the
step's CUDA graph replayed alone, the profiler's kernel time a step, tokens a round (verify
rounds; 1 for plain decode), tok/s (tokens a round over the engine step), chained rounds and
rounds launched ahead (`--spec mtp`'s verify chain).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import (meta_lines, meta_of, note_lines, table_parser,  # noqa: E402
                    write_report)

PATTERNS = {
    "engine_step_ms": r"engine step ([\d.]+) ms",
    "kernel_ms_per_step": r"kernel time per step ([\d.]+) ms",
    "graph_alone_ms": r"replayed alone ([\d.]+) ms",
    "tokens_per_round": r"([\d.]+) tokens a round",
    "chained_rounds": r"chained rounds (\d+)",
    "launched_ahead": r"launched ahead (\d+)",
}


def parse(log: Path) -> dict:
    text = log.read_text(errors="replace")
    run: dict = {"name": log.stem.removeprefix("step-")}
    for key, pattern in PATTERNS.items():
        m = re.search(pattern, text)
        run[key] = None if m is None else float(m.group(1))
    m = re.search(r"^sampling: (.*)$", text, re.M)
    run["sampling"] = m.group(1) if m else None
    if run["engine_step_ms"] is None:
        run["error"] = next((line for line in reversed(text.splitlines())
                             if "Error" in line), "no engine step line")
        return run
    tokens = run["tokens_per_round"] or 1.0
    run["tok_s"] = round(1000 * tokens / run["engine_step_ms"], 1)
    return run


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [*meta_lines(m),
             "| run | engine step ms | graph alone ms | kernel ms a step | tokens a round "
             "| tok/s | chained rounds | launched ahead |", "|---" + "|---:" * 7 + "|"]

    def cell(v):
        return "—" if v is None else f"{v:g}"
    for r in result["runs"]:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error'][:80]} |" + " |" * 6)
            continue
        lines.append(f"| {r['name']} | " + " | ".join(cell(r[k]) for k in (
            "engine_step_ms", "graph_alone_ms", "kernel_ms_per_step", "tokens_per_round",
            "tok_s", "chained_rounds", "launched_ahead")) + " |")
    sampled = [r for r in result["runs"]  # greedy rows go without saying
               if r.get("sampling") and "temperature=0.0" not in r["sampling"]]
    if sampled:
        lines += ["", *(f"- {r['name']} sampled with `{r['sampling']}`" for r in sampled)]
    return "\n".join(lines + note_lines(m)) + "\n"


def main() -> None:
    ap = table_parser(__doc__)
    ap.add_argument("--runs", help="comma-separated run names, in this order (default: all)")
    args = ap.parse_args()
    logs = {p.stem.removeprefix("step-"): p for p in sorted(args.dir.glob("step-*.log"))}
    names = args.runs.split(",") if args.runs else list(logs)
    runs = [parse(logs[n]) for n in names]
    write_report(args.out, {"meta": meta_of(args), "runs": runs}, markdown)


if __name__ == "__main__":
    main()
