"""`bench/b1_regression_device.sh`'s `ninfer bench` files as one results table (JSON + markdown):
per shape, the batch-1 decode at 1K of the tree issue 18 measured and of this tree, timed in
one call on one card, and their ratio.

    python3 bench/b1_regression_table.py DIR --out bench/results/NAME --machine M --date D \
        --tree SHA --command C [--note TEXT]...

DIR holds `b1-ARCH-TAG.json` (TAG: `issue` for the issue's tree; `now`, `now-again` for this
tree's, in the order they ran).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import (meta_lines, meta_of, note_lines, table_parser,  # noqa: E402
                    write_report)

SHAPES = (("35b-a3b", "fp8-row"), ("flash-next", "fp8-row"), ("27b", "bf16"))
BASELINE = "issue"


def decode_row(path: Path) -> dict | None:
    """The 1K-context decode row of one `ninfer bench --out` file (None: absent or failed)."""
    if not path.is_file():
        return None
    rows = json.loads(path.read_text()).get("decode") or []
    row = next((r for r in rows if r.get("context") == 1024), None)
    return None if row is None else {k: row.get(k) for k in ("tok_s", "step_ms",
                                                            "roofline_tok_s")}


def collect(folder: Path) -> list[dict]:
    shapes = []
    for arch, weights in SHAPES:
        tags = sorted({p.stem.split(f"b1-{arch}-", 1)[1]
                       for p in folder.glob(f"b1-{arch}-*.json")})
        runs = {tag: decode_row(folder / f"b1-{arch}-{tag}.json") for tag in tags}
        base = runs.get(BASELINE)
        ours = [r["tok_s"] for t, r in runs.items() if t != BASELINE and r]
        shapes.append(dict(arch=arch, weights=weights, runs=runs,
                           ratio=(round(min(ours) / base["tok_s"], 3)
                                  if base and ours else None)))
    return shapes


def markdown(result: dict) -> str:
    m = result["meta"]
    lines = [*meta_lines(m),
             "| shape | weights | issue's tree tok/s | this tree tok/s | this / issue's "
             "(slower run) | roofline tok/s |", "|---|---|---:|---:|---:|---:|"]
    for s in result["shapes"]:
        base = s["runs"].get(BASELINE)
        ours = [f"{r['tok_s']:.1f}" for t, r in s["runs"].items() if t != BASELINE and r]
        roof = next((r["roofline_tok_s"] for r in s["runs"].values() if r), None)
        lines.append(f"| {s['arch']} | {s['weights']} | "
                     f"{'—' if base is None else format(base['tok_s'], '.1f')} | "
                     f"{', '.join(ours) or '—'} | "
                     f"{'—' if s['ratio'] is None else format(s['ratio'], '.3f') + '×'} | "
                     f"{'—' if roof is None else format(roof, '.0f')} |")
    return "\n".join(lines + note_lines(m)) + "\n"


def main() -> None:
    ap = table_parser(__doc__, title="Issue 18's batch-1 bound: the issue's tree against this "
                      "one, `ninfer bench` at 1K context, one card, one call")
    args = ap.parse_args()
    write_report(args.out, {"meta": meta_of(args), "shapes": collect(args.dir)}, markdown)


if __name__ == "__main__":
    main()
