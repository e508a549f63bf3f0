"""Routed experts in host RAM: the tier, the per-step split, the ceiling, llama.cpp's `-ncmoe`."""
from __future__ import annotations

from . import load


def expert_offload_rows() -> list[str]:
    """Routed experts in host RAM, Flash-Next cut to 16 layers (`bench/expert_offload.py`):
    B=1 at a quarter, half and 80 % of the experts off the device against every expert on it
    (the same call's), per routing; `--expert-cpu-share auto` against none (one call); half of
    each layer-step's misses on the host's cores (H100, one machine's calls); and
    llama.cpp's `-ncmoe` beside ours in one call (`bench/offload_peer_table.py`, an older
    tree of ours)."""
    peer, r = load("h200-expert-offload-peer.json"), load("h200-expert-offload-all.json")
    auto = load("h200-expert-offload-cpu-auto.json")
    rows = []

    def rate(run, routing, share, stacked, asked=0.0):
        return next(row["tok_s"] for row in run["rows"] if row["routing"] == routing
                    and row["host_share"] == share and row["batch"] == 1
                    and row["path"].startswith("all stacked") == stacked
                    and row.get("cpu_share_asked", 0.0) == asked)
    shape = "H200, Flash-Next shape cut to 16 layers"
    if r:
        for share in (0.25, 0.5, 0.8):
            for routing in ("skewed", "uniform"):
                part, full = rate(r, routing, share, False), rate(r, routing, 0.0, True)
                rows.append(f"| {shape}, fp8-row, batch 1, {share:.0%} of the routed experts in "
                            f"host RAM ({routing} routing) | {part:.0f} tok/s | every expert on "
                            f"the device {full:.0f} | {part / full:.2f}× |")
    if auto:
        for share in (0.5, 0.8):
            got, none = ([rate(auto, routing, share, False, asked=asked)
                          for routing in ("uniform", "skewed")] for asked in ("auto", 0.0))
            rows.append(f"| {shape}, fp8-row, batch 1, {share:.0%} in host RAM (uniform; "
                        f"skewed routing), `--expert-cpu-share auto` (each layer computes 0.4 "
                        f"of its misses on the host's cores while it misses 3+ experts a "
                        f"step) | {got[0]:.0f}; {got[1]:.0f} tok/s | none {none[0]:.0f}; "
                        f"{none[1]:.0f} (same call) | {got[0] / none[0]:.2f}×; "
                        f"{got[1] / none[1]:.2f}× |")
    split = load("h100-expert-offload-split-auto.json")
    if split:  # one H100 machine, three calls: each rate from the first process that measured it
        def first(routing, share, asked):
            return next(row["tok_s"] for run in split["runs"] for row in run["rows"]
                        if row["routing"] == routing and row["host_share"] == share
                        and row["batch"] == 1 and row.get("cpu_share_asked") == asked
                        and not row["path"].startswith("all stacked"))
        full = rate(split["runs"][0], "uniform", 0.0, True)
        for share in (0.25, 0.5, 0.8):
            got, bus = ([first(routing, share, asked) for routing in ("uniform", "skewed")]
                        for asked in ("auto", 0.0))
            rows.append(f"| H100, Flash-Next shape cut to 16 layers, fp8-row, batch 1, "
                        f"{share:.0%} in host RAM (uniform; skewed routing), "
                        f"`--expert-cpu-share auto` (each layer-step's misses split between the "
                        f"bus and the host's cores by timed costs) | {got[0]:.0f}; {got[1]:.0f} "
                        f"tok/s | every expert on the device {full:.0f}; the bus alone "
                        f"{bus[0]:.0f}; {bus[1]:.0f} (same machine) | {got[0] / full:.2f}×; "
                        f"{got[1] / full:.2f}× |")
    ceiling = load("h200-expert-offload-ceiling.json")
    if ceiling:  # arithmetic over the measured rates (`bench/offload_ceiling.py`)
        for row in ceiling["rows"]:
            rows.append(f"| {shape}, fp8-row, batch 1, {row['host_share']:.0%} of the routed "
                        f"experts in host RAM (uniform routing), the best measured against the "
                        f"ceiling from the host's measured rates (bus {ceiling['bus_gbps']} "
                        f"GB/s, CPU worker {ceiling['cpu_gbps']} GB/s, "
                        f"{row['host_mb_per_token']:.0f} MB a token) | "
                        f"{row['measured_best_tok_s']:.0f} tok/s | bound (overlapped) "
                        f"{row['overlapped_tok_s']:.0f}; model (reads on the step's path) "
                        f"{row['bus_serial_tok_s']:.0f} | "
                        f"{row['measured_best_tok_s'] / row['overlapped_tok_s']:.2f}× the bound |")
    for peer, machine, ours in ((peer, "H200", "stop 43's tree"),
                                (load("h100-expert-offload-peer-split.json"), "H100",
                                 "the per-step CPU split, `auto`")):
        for row in (peer or {"rows": []})["rows"][1:]:
            skewed = row["ours_skewed_tok_s"]
            rows.append(f"| {machine}, Flash-Next shape cut to 16 layers, batch 1, "
                        f"{row['ours_share']:.0%} of the routed experts in host RAM (uniform; "
                        f"skewed routing), ours fp8-row ({ours}) against llama.cpp Q8_0 "
                        f"`-ncmoe {row['n_cpu_moe']}` (one call) | "
                        f"{row['ours_uniform_tok_s']:.0f}; {skewed:.0f} tok/s "
                        f"| llama.cpp {row['llama_tok_s']:.0f} | {row['ratio_uniform']:.2f}×; "
                        f"{row['ratio_skewed']:.2f}× |")
    return rows
