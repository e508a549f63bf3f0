"""Routed experts in host RAM beside llama.cpp's `--n-cpu-moe` (issue 20): one JSON and one
markdown table from a device call that ran both on the same shape.

    python3 bench/offload_peer_table.py --ours eo-peer.json --llama llama-ncmoe-{0,8,13}.json \
        [--ab-new eo-new.json --ab-old eo-old.json] --out bench/results/h200-expert-offload-peer

`--ours`: `bench/expert_offload.py`'s JSON (Flash-Next cut to N layers, fp8-row); `--llama`:
`llama-bench -o json` runs of the same shape written by `bench/peer_gguf.py` (Q8_0), one per
`-ncmoe` value (the experts of the first N layers in host RAM, computed there by the CPU
backend). Rows pair llama.cpp's N of L layers with ours at the nearest share of routed-expert
bytes off the device (every layer keeps that share in slots). `--ab-new/--ab-old`: the same
tool's runs of two trees in one call, shown side by side at B = 1 and 8."""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _ours(rows: list[dict], share: float, routing: str, batch: int,
          cpu: float | str = 0.0) -> float | None:
    """Our rate at `share` off the device; the tier's rows with `--expert-cpu-share cpu` (the
    all-on-device rows have none)."""
    for row in rows:
        if (abs(row["host_share"] - share) < 1e-9 and row["routing"] == routing
                and row["batch"] == batch
                and row.get("cpu_share_asked", 0.0) == (cpu if share > 0 else 0.0)):
            return row["tok_s"]
    return None


def build(ours: dict, llama: list[dict], layers: int, cpu: float | str = 0.0) -> dict:
    runs = sorted((run for doc in llama for run in doc), key=lambda run: run["n_cpu_moe"])
    shares = sorted({row["host_share"] for row in ours["rows"]})
    table = []
    for run in runs:
        n = run["n_cpu_moe"]
        share = min(shares, key=lambda s: abs(s - n / layers))
        entry = dict(n_cpu_moe=n, llama_share=n / layers, llama_tok_s=run["avg_ts"],
                     llama_stddev=run["stddev_ts"], ours_share=share)
        for routing in ("uniform", "skewed"):
            mine = _ours(ours["rows"], share, routing, 1, cpu)
            entry[f"ours_{routing}_tok_s"] = mine
            entry[f"ratio_{routing}"] = mine / run["avg_ts"] if mine else None
        table.append(entry)
    first = runs[0]
    return dict(date=ours["date"], machine=ours["machine"], ours_command=ours["command"],
                ours_cpu_share=cpu,
                llama=dict(build=first["build_commit"], model_type=first["model_type"],
                           model_size=first["model_size"], threads=first["n_threads"],
                           cpu=first["cpu_info"], gpu=first["gpu_info"],
                           n_gen=first["n_gen"], flash_attn=first["flash_attn"]),
                layers=layers, rows=table)


def markdown(r: dict, ab: dict | None) -> str:
    ll, m = r["llama"], r["machine"]
    lines = [f"# Routed experts in host RAM beside llama.cpp `--n-cpu-moe`: Flash-Next shape, "
             f"{r['layers']} layers", "",
             f"{r['date']}, {m['device']} with {ll['cpu']} ({ll['threads']} threads), one device "
             f"call for both. Ours: `{r['ours_command']}` (fp8-row experts, torch {m['torch']}). "
             f"llama.cpp {ll['build']} built on that machine with `GGML_NATIVE=ON`: `llama-bench "
             f"-ngl 99 -fa 1 -t {ll['threads']} -p 0 -n {ll['n_gen']} -r 3 -ncmoe N` on a random "
             f"Q8_0 GGUF of the same shape (`bench/peer_gguf.py`, {ll['model_size'] / 2**30:.1f} "
             f"GiB). Host → device {m['h2d_gbps']:.1f} GB/s. Ours with "
             f"`--expert-cpu-share {r.get('ours_cpu_share') or 'off'}`. Same VRAM for routed "
             "experts: "
             "llama.cpp keeps N of the layers' experts in host RAM (computed there by its CPU "
             "backend), ours keeps the same share of every layer's experts there (read in place "
             "over PCIe by the captured step, the hottest cached in device slots). llama.cpp's "
             "rate does not depend on routing (it computes every expert of its host layers on "
             "the CPU), so its one figure stands beside both of ours.", "",
             "| llama.cpp -ncmoe | off device (llama / ours) | llama.cpp B=1 tok/s "
             "| ours uniform | × llama | ours skewed | × llama |",
             "|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        def cell(key):
            v = row[key]
            return "" if v is None else f"{v:.1f}"

        def ratio(key):
            v = row[key]
            return "" if v is None else f"{v:.2f}"
        lines.append(f"| {row['n_cpu_moe']} of {r['layers']} | {row['llama_share']:.0%} / "
                     f"{row['ours_share']:.0%} | {row['llama_tok_s']:.1f} ± "
                     f"{row['llama_stddev']:.1f} | {cell('ours_uniform_tok_s')} "
                     f"| {ratio('ratio_uniform')} | {cell('ours_skewed_tok_s')} "
                     f"| {ratio('ratio_skewed')} |")
    if r.get("note"):
        lines += ["", r["note"]]
    if ab:
        lines += ["", f"## Two trees of the tier in one call ({ab['date']})", "",
                  f"`{ab['command']}` with the tree before (`{ab['old_label']}`) and after "
                  f"(`{ab['new_label']}`): tok/s.", "",
                  "| routing | off device | path | B | before | after | × |",
                  "|---|---|---|---|---|---|---|"]
        for row in ab["rows"]:
            lines.append(f"| {row['routing']} | {row['host_share']:.0%} | {row['path']} "
                         f"| {row['batch']} | {row['old']:.1f} | {row['new']:.1f} "
                         f"| {row['new'] / row['old']:.2f} |")
    return "\n".join(lines) + "\n"


def _config(row: dict) -> tuple:
    return row["routing"], row["host_share"], row["path"], row["batch"]


def ab_rows(new: dict, old: dict) -> list[dict]:
    before = {_config(row): row["tok_s"] for row in old["rows"]}
    return [dict(routing=row["routing"], host_share=row["host_share"], path=row["path"],
                 batch=row["batch"], old=before[_config(row)], new=row["tok_s"])
            for row in new["rows"] if _config(row) in before]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", required=True)
    ap.add_argument("--llama", nargs="+", required=True)
    ap.add_argument("--cpu-share", default=0.0,
                    type=lambda v: v if v == "auto" else float(v), metavar="F|auto",
                    help="our rows with this --expert-cpu-share (default 0: none)")
    ap.add_argument("--ab-new")
    ap.add_argument("--ab-old")
    ap.add_argument("--labels", nargs=2, default=("before", "after"), metavar=("OLD", "NEW"))
    ap.add_argument("--note", default="", help="a paragraph after the peer table")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    ours = json.loads(Path(args.ours).read_text())
    result = build(ours, [json.loads(Path(p).read_text()) for p in args.llama], ours["layers"],
                   args.cpu_share)
    result["note"] = args.note
    ab = None
    if args.ab_new and args.ab_old:
        new, old = (json.loads(Path(p).read_text()) for p in (args.ab_new, args.ab_old))
        ab = dict(date=new["date"], command=new["command"], old_label=args.labels[0],
                  new_label=args.labels[1], rows=ab_rows(new, old))
        result["ab"] = ab
    Path(f"{args.out}.json").write_text(json.dumps(result, indent=1))
    Path(f"{args.out}.md").write_text(markdown(result, ab))


if __name__ == "__main__":
    main()
