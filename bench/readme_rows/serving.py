"""Served over HTTP: the engine process, load against llama-server, the host prefix tier."""
from __future__ import annotations

from . import load


def engine_process_rows() -> list[str]:
    """The engine in its own process against the engine in the HTTP process, and the 8-layer
    in-process server beside llama-server, one lease each (`bench/engine_process_ab.sh`)."""
    r = load("h200-engine-process.json")
    if not r:
        return []
    c8 = [run["8"]["aggregate_tok_s"] for name, run in r["served"].items()
          if name.startswith("engine process")]
    inproc = r["served"]["in-process"]["8"]["aggregate_tok_s"]
    engine = r["engine_step"]["served sampling (preset penalties), run after the servers"]["8"]
    lo, hi = min(c8), max(c8)
    rows = [f"| H200, 35B-A3B shape cut to 4 layers, served aggregate at concurrency 8, the "
            f"engine in its own process against the engine in the HTTP process (same tree, "
            f"same lease) | {lo:,.0f}-{hi:,.0f} tok/s | in-process {inproc:,.0f} | "
            f"{lo / inproc:.2f}-{hi / inproc:.2f} |",
            f"| H200, same, served aggregate at concurrency 8 against the engine's own step at "
            f"batch 8 (`ninfer bench --sampling served`, same lease) | {lo:,.0f}-{hi:,.0f} "
            f"tok/s | engine {engine:,.0f} | {lo / engine:.2f}-{hi / engine:.2f} |"]
    same = r.get("served_8l_same_lease")
    if same:
        ours = [run["8"]["aggregate_tok_s"] for name, run in same["servers"].items()
                if name.startswith("ninfer")]
        peer = same["servers"]["llama-server"]["8"]["aggregate_tok_s"]
        rows.append(f"| H200, 35B-A3B shape cut to 8 layers, served aggregate at concurrency 8, "
                    f"engine in the HTTP process (same lease as the peer) | {min(ours):,.0f}-"
                    f"{max(ours):,.0f} tok/s (fp8-row) | llama-server {peer:,.0f} (Q8_0) | "
                    f"{min(ours) / peer:.2f}-{max(ours) / peer:.2f} |")
    return rows


def served_rows() -> list[str]:
    """ninfer-serve and llama-server over HTTP under one load (`bench/served_load.sh`)."""
    rows = []
    # (result, shape, our bits, the peer's, where the peer ran: None = the same run)
    for name, shape, ours_bits, peer_bits, peer_file in (
            ("h200-served-35b-a3b-8l-peer-gdn.json", "35B-A3B shape cut to 8 layers, "
             "tree 6a1a8a9", "fp8-row", "Q8_0", None),
            ("h200-served-35b-a3b-8l-fp8-act.json", "35B-A3B shape cut to 8 layers, "
             "e4m3 prompt activations of f17209f (no peer in that lease)", "fp8-row", "Q8_0",
             None),
            ("h200-served-27b-16l-ratio.json", "27B shape cut to 16 layers, tree 6b53bbc "
             "(no peer in that lease)", "bf16", "bf16", None),
            ("h200-served-35b-a3b-8l-peer.json", "35B-A3B shape cut to 8 layers, "
             "tree d4946b0", "fp8-row", "Q8_0", None),
            ("h200-served-35b-a3b-8l-fused-prompt.json", "35B-A3B shape cut to 8 layers, "
             "fused prompt kernels of d3c86c5 (no peer in that lease)", "fp8-row", "Q8_0", None),
            ("h200-served-35b-a3b-8l-prompt-steps.json", "35B-A3B shape cut to 8 layers, "
             "prompt steps of 25ef80b (no peer in that lease)", "fp8-row", "Q8_0", None),
            ("h200-served-35b-a3b-8l-process.json", "35B-A3B shape cut to 8 layers, "
             "engine process", "fp8-row", "Q8_0", None),
            ("h200-served-35b-a3b-8l.json", "35B-A3B shape cut to 8 layers", "fp8-row", "Q8_0",
             None),
            ("h200-served-35b-a3b-4l-slots.json", "35B-A3B shape cut to 4 layers", "fp8-row",
             "Q8_0", None),
            ("h200-served-27b-16l.json", "27B shape cut to 16 layers", "bf16", "bf16", None)):
        r = load(name)
        if not r:
            continue
        levels = {run["label"]: {lv["concurrency"]: lv for lv in run["levels"]}
                  for run in r["runs"]}
        ours = levels.get("ninfer-after")
        peer_runs = load(peer_file)["runs"] if peer_file else r["runs"]
        peer = next(({lv["concurrency"]: lv for lv in run["levels"]} for run in peer_runs
                     if run["label"] == "llama-server"), None)
        where = " (another lease)" if peer_file else ""
        for c, key, what in ((1, "decode_tok_s_median", "per-stream decode at concurrency 1"),
                             (8, "aggregate_tok_s", "aggregate decode at concurrency 8")):
            if ours and peer and c in ours and c in peer:
                a, b = ours[c][key], peer[c][key]
                rows.append(f"| H200, {shape}, served over HTTP "
                            f"(`serve_load.py`, 256 tokens out), {what} | {a:.0f} tok/s "
                            f"({ours_bits}) | llama-server {b:.0f} ({peer_bits}){where} "
                            f"| {a / b:.2f} |")
        # the same shape's engine step: measured in the same lease, or another one's
        engine = (r.get("engine") or [None])[0] or load(name.replace("served", "ninfer-bench"))
        lease = "same lease" if r.get("engine") else "another machine lease"
        top = max((engine or {}).get("concurrency") or [{}], key=lambda c: c.get("concurrency", 0))
        if ours and top.get("concurrency") in ours:
            c = top["concurrency"]
            served = ours[c]["aggregate_tok_s"]
            rows.append(f"| H200, {shape}, served aggregate at concurrency {c} against the "
                        f"engine's own step at batch {c} (`ninfer bench`, {lease}) | "
                        f"{served:.0f} tok/s | engine {top['tok_s']:.0f} | "
                        f"{served / top['tok_s']:.2f} |")
    return rows


def host_tier_rows() -> list[str]:
    """A turn whose long prefix was pushed out to the host tier (`bench/host_tier_ttft.py`)."""
    r = load("h200-host-tier-ttft-35b-a3b.json")
    if not r:
        return []
    tier = r["rows"]["device + host tier"]
    what = (f"H200, 35B-A3B shape cut to {r['layers']} layers, TTFT of a {r['turn_tokens']}-token "
            f"turn after its {r['prompt_tokens']}-token prefix was evicted, restored from the "
            "host tier (medians of 3 passes)")
    return [f"| {what} | {tier['after_eviction_ttft_s'] * 1000:.0f} ms | cold prefill "
            f"{tier['cold_ttft_s'] * 1000:.0f} ms | {tier['speedup_vs_cold']:.1f}× |"]
