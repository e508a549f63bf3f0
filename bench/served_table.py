"""Collect `bench/served_load.sh serve` outputs (serve_load.py and serve_staggered.py JSON per
server) into one result
file and its markdown table: per server and concurrency level, aggregate and per-stream tok/s,
median TTFT, and each server's aggregate against the peer's.

    python bench/served_table.py DIR --out bench/results/NAME.json --markdown NAME.md \
        --machine "..." --command "..." --note "..."
"""
from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path, help="folder holding served-*.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--markdown", type=Path, required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--peer", default="llama-server", help="label of the reference server")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    runs = [json.loads(p.read_text()) for p in sorted(args.dir.glob("served-*.json"))]
    # a load whose every request failed has no figures: named under the tables instead
    loads = [json.loads(p.read_text()) for pattern in ("staggered-*.json", "burst-*.json")
             for p in sorted(args.dir.glob(pattern))]
    failed = [r for r in loads if not r.get("ok")]
    staggered = [r for r in loads if r.get("ok") and "stagger_s" in r and r["stagger_s"] > 0]
    bursts = [r for r in loads if r.get("ok") and r not in staggered]
    # a load's rows against the peer's under the same load ("-long": LONG_LOAD's prompts)
    peer = {(r["label"][len(args.peer):], lv["concurrency"]): lv for r in runs
            if r["label"].startswith(args.peer) for lv in r["levels"]}
    result = {"machine": args.machine, "command": args.command, "note": args.note,
              "date": datetime.date.today().isoformat(), "runs": runs, "staggered": staggered,
              "bursts": bursts, "failed": failed}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Served load: {args.note}", "",
             f"Machine: {args.machine}. Date: {result['date']}. Command: `{args.command}`.", "",
             "| server | concurrency | requests ok | aggregate tok/s | per-stream tok/s | "
             f"TTFT median | prompt tok | aggregate / {args.peer} |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        for lv in run["levels"]:
            ref = peer.get(("-long" if run["label"].endswith("-long") else "",
                            lv["concurrency"]))
            ratio = f"{lv['aggregate_tok_s'] / ref['aggregate_tok_s']:.2f}" if ref else "—"
            lines.append(
                f"| {run['label']} | {lv['concurrency']} | {lv['ok']}/{lv['requests']} | "
                f"{lv['aggregate_tok_s']:.0f} | {lv['decode_tok_s_median']:.0f} | "
                f"{lv['ttft_median_s'] * 1000:.0f} ms | {lv['prompt_tokens_median']:.0f} | "
                f"{ratio} |")
    if staggered:
        lines += ["", "Staggered arrivals (`bench/serve_staggered.py`: stream i starts i/C of a "
                  "request's duration late, so prompts arrive while the others decode):", "",
                  "| server | concurrency | requests ok | aggregate tok/s | per-stream tok/s | "
                  "TTFT median | TTFT p99 | gap between tokens p50 / p99 / max |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for run in staggered:
            gaps = " / ".join(f"{run[k] * 1000:.1f}" for k in ("gap_p50_s", "gap_p99_s",
                                                                "gap_max_s")) + " ms" \
                if run.get("gap_p99_s") is not None else "—"  # runs before the gaps were kept
            lines.append(
                f"| {run['label']} | {run['concurrency']} | {run['ok']}/{run['requests']} | "
                f"{run['aggregate_tok_s']:.0f} | {run['decode_tok_s_median']:.0f} | "
                f"{run['ttft_median_s'] * 1000:.0f} ms | {run['ttft_p99_s'] * 1000:.0f} ms | "
                f"{gaps} |")
    if bursts:
        alone = {b["label"].rsplit("-burst", 1)[0]: b["ttft_median_s"] for b in bursts
                 if b["concurrency"] == 1}
        lines += ["", "TTFT of long prompts arriving together (`serve_staggered.py --burst`: C "
                  "streams start at once; the target is p99 at C=8 within 2x the C=1 TTFT):",
                  "", "| server | concurrency | requests ok | prompt tok | TTFT median | TTFT p99 "
                  "| p99 / C=1 median |", "|---|---:|---:|---:|---:|---:|---:|"]
        for run in bursts:
            base = alone.get(run["label"].rsplit("-burst", 1)[0])
            ratio = f"{run['ttft_p99_s'] / base:.2f}" if base else "—"
            lines.append(
                f"| {run['label']} | {run['concurrency']} | {run['ok']}/{run['requests']} | "
                f"{run['prompt_tokens_median']:.0f} | {run['ttft_median_s'] * 1000:.0f} ms | "
                f"{run['ttft_p99_s'] * 1000:.0f} ms | {ratio} |")
    if failed:
        lines += [""] + [f"{r['label']}: 0 of {r['requests']} requests succeeded "
                         f"({'; '.join(r.get('errors', []))})" for r in failed]
    engines = [json.loads(p.read_text()) for p in sorted(args.dir.glob("engine-*.json"))]
    if engines:
        result["engine"] = engines
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        ours = {lv["concurrency"]: lv for r in runs if r["label"] == "ninfer-after"
                for lv in r["levels"]}
        lines += ["", "The engine's own step on the same shape in the same lease (`ninfer bench "
                  "--sampling served`: the requests a served client sends, context 1024), "
                  "against the served aggregate at the same concurrency:", "",
                  "| concurrency | engine tok/s | step ms | first token max | served / engine |",
                  "|---:|---:|---:|---:|---:|"]
        for lv in (lv for e in engines for lv in e["concurrency"]):
            served = ours.get(lv["concurrency"])
            ratio = f"{served['aggregate_tok_s'] / lv['tok_s']:.2f}" if served else "—"
            lines.append(f"| {lv['concurrency']} | {lv['tok_s']:.0f} | {lv['step_ms']:.2f} | "
                         f"{lv['ttft_ms_max']:.0f} ms | {ratio} |")
    args.markdown.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
