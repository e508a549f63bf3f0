"""Issue 18's TTFT ratio from one `bench/ttft_burst_device.sh` call: its `burst-c{1,8}-{round}`
JSON files (bench/serve_staggered.py --burst) into one results JSON and a markdown table, with
each round's TTFT p99 at concurrency 8 over TTFT at concurrency 1 (the median and the p99).
Where the call kept the servers' request logs (`requests[-pN].jsonl`), each run's requests
there (its `span_unix_ms`) give the server's side: median prepare, queue wait, TTFT and first
output (the token's arrival in the HTTP process), all from the request's arrival.

    python3 bench/ttft_burst_table.py RUN_DIR --gpu H100 --machine "NVIDIA H100 80GB HBM3, ..." \
        --tree 6df9dd2 --out bench/results/h100-ttft-burst-2
"""
from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
from pathlib import Path

COMMAND = ("OUT=$OUT [CHUNKS=...] ROUNDS={rounds}{layers} bash bench/ttft_burst_device.sh "
           "(ninfer-serve --max-concurrency 8 --max-context 8192 --kv-capacity 65536 "
           "[--prefill-chunk N]; "
           "bench/serve_staggered.py --burst --concurrency 1|8 --requests 16 --max-tokens 64 "
           "--prompt-chars 4300, {rounds} times each)")
TITLE = ("TTFT of 1K-token prompts one at a time and eight together ({gpu}, 35B-A3B shape{depth}, "
         "fp8-row, served over HTTP)")


LABEL = re.compile(r"burst(\d+)-(\d+)(-.+)?$")  # burstC-ROUND[-SERVER], as the script names


def run_key(label: str) -> tuple:
    """(server, round, concurrency): the table's order (server: "" for the server's own
    chunk, else "-p" and the chunk given; `readme_table.py` picks a server's runs by it)."""
    c, r, server = LABEL.match(label).groups()
    return server or "", int(r), int(c)


def ratios(bursts: dict[str, dict]) -> dict[str, dict]:
    """Per server and round: TTFT p99 at concurrency 8 over the median and the p99 at 1."""
    out = {}
    for server, r in sorted({run_key(label)[:2] for label in bursts}):
        one, eight = bursts.get(f"burst1-{r}{server}"), bursts.get(f"burst8-{r}{server}")
        if one and eight:
            p99 = eight["ttft_p99_s"]
            name = f"round {r}" + (f" ({server[1:]})" if server else "")
            out[name] = dict(p99_c8_over_median_c1=round(p99 / one["ttft_median_s"], 2),
                             p99_c8_over_p99_c1=round(p99 / one["ttft_p99_s"], 2))
    return out


SERVER_TIMES = ("prepare", "queue", "ttft", "first_output")


def server_side(bursts: list[dict], run_dir: Path) -> None:
    """Each burst's `server` figures: the medians of its requests' times in its server's
    request log, ms (bursts of a call without the logs, or before `span_unix_ms`, get none)."""
    logs: dict[Path, list[dict]] = {}  # each server's log read once, for all its runs
    for b in bursts:
        log = run_dir / f"requests{run_key(b['label'])[0]}.jsonl"
        if "span_unix_ms" not in b or not log.exists():
            continue
        if log not in logs:
            logs[log] = [e for e in map(json.loads, log.read_text().splitlines())
                         if e["event"] == "request_done"]
        start, end = b["span_unix_ms"]
        done = [e for e in logs[log] if start <= e["timestamp_unix_ms"] <= end]
        times = {name: [] for name in SERVER_TIMES}
        for e in done:
            seconds = e["timings_seconds"]
            for name in SERVER_TIMES:
                value = (e["engine_timing"]["queue_wait_seconds"] if name == "queue"
                         else seconds.get(name))
                if value is not None:
                    times[name].append(value * 1e3)
        b["server"] = {"requests": len(done), **{f"{name}_median_ms": round(
            statistics.median(v), 2) for name, v in times.items() if v}}


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"# {meta['title']}", "", f"- machine: {meta['machine']}", f"- date: {meta['date']}",
             f"- tree: {meta['tree']}", f"- command: {meta['command']}", "",
             "| run | concurrency | requests | TTFT median ms | TTFT p99 ms "
             "| per-stream decode tok/s (median) | aggregate tok/s | prompt tokens cached |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for b in result["bursts"]:  # runs before serve_staggered reported the cache: "—"
        cached = b.get("cached_prompt_tokens")
        lines.append(f"| {b['label']} | {b['concurrency']} | {b['ok']}/{b['requests']} "
                     f"| {b['ttft_median_s'] * 1e3:.1f} | {b['ttft_p99_s'] * 1e3:.1f} "
                     f"| {b['decode_tok_s_median']:.0f} | {b['aggregate_tok_s']:.0f} "
                     f"| {'—' if cached is None else f'{cached:,}'} |")
    served = [b for b in result["bursts"] if "server" in b]
    if served:
        lines += ["", "The server's side (its request log; medians from each request's arrival, "
                  "ms; first output: when the token reached the HTTP process):", "",
                  "| run | requests | prepare | queue | TTFT | first output |",
                  "|---|---:|---:|---:|---:|---:|"]
        for b in served:
            cells = [b["server"].get(f"{name}_median_ms") for name in SERVER_TIMES]
            lines.append(f"| {b['label']} | {b['server']['requests']} | " + " | ".join(
                "—" if v is None else f"{v:.1f}" for v in cells) + " |")
    lines += ["", "| round | p99 at 8 / median at 1 | p99 at 8 / p99 at 1 |", "|---|---:|---:|"]
    for name, r in result["ratios"].items():
        lines.append(f"| {name} | {r['p99_c8_over_median_c1']:.2f} "
                     f"| {r['p99_c8_over_p99_c1']:.2f} |")
    lines += ["", "Issue 18's target: TTFT p99 at concurrency 8 ≤ 2 × TTFT at concurrency 1."]
    if result.get("note"):
        lines += ["", result["note"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="the call's r/ folder (burst-c*-*.json)")
    ap.add_argument("--machine", required=True)
    ap.add_argument("--gpu", required=True, help="the GPU's short name for the title: H100, H200")
    ap.add_argument("--tree", required=True, help="the commit the call ran")
    ap.add_argument("--layers", type=int, default=8, help="the call's LAYERS (40: all)")
    ap.add_argument("--date", default=datetime.date.today().isoformat())
    ap.add_argument("--out", type=Path, required=True, help="path without .json/.md")
    ap.add_argument("--note", type=Path, help="a markdown file of what the server's log showed")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from report import write_report  # (torch: not for `readme_table.py`, which imports this)

    bursts = sorted((json.loads(p.read_text()) for p in args.run_dir.glob("burst-c*-*.json")),
                    key=lambda b: run_key(b["label"]))
    if not bursts:
        raise SystemExit(f"no burst-c*-*.json in {args.run_dir}")
    server_side(bursts, args.run_dir)
    depth = " (all 40 layers)" if args.layers == 40 else f" cut to {args.layers} layers"
    result = dict(meta=dict(title=TITLE.format(gpu=args.gpu, depth=depth), machine=args.machine,
                            date=args.date, tree=args.tree, command=COMMAND.format(
                                rounds=max(run_key(b["label"])[1] for b in bursts),
                                layers="" if args.layers == 8 else f" LAYERS={args.layers}")),
                  bursts=bursts, ratios=ratios({b["label"]: b for b in bursts}),
                  note=args.note.read_text().strip() if args.note else None)
    write_report(args.out, result, markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
