"""Regenerate README's "Measured speeds" table from the committed result files.

    python bench/readme_table.py          # rewrites the table between the README markers
    python bench/readme_table.py --check  # exit 1 when README is out of date (used by a test)

Only numbers present in `bench/results/*.json` reach the table; a missing file drops its rows.
A prefill-only run `NAME-prefill.json` beside `NAME.json` gives that shape's prefill row.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from ttft_burst_table import ratios, run_key  # this folder: the script's own on sys.path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README = ROOT / "README.md"
BEGIN, END = "<!-- speeds:begin -->", "<!-- speeds:end -->"


def _load(name: str) -> dict | None:
    path = RESULTS / name
    return json.loads(path.read_text()) if path.is_file() else None


def _cpu_rows() -> list[str]:
    rows = []
    r = _load("cpu-default-model.json")
    if r:
        o, e, p = r["ninfer"], r["ninfer_eager"], r["peer"]
        busy = max(o["foreign_load_cores"] or 0.0, p.get("foreign_load_cores") or 0.0)
        # a shared box's run says so: another busy core halves a 2-thread engine or worse
        loaded = f"; other processes busy, {busy:.1f} cores: low" if busy >= 0.25 else ""
        rows.append(f"| default model, 2-core CPU, decode tok/s ({o['prompt_tokens']}-token "
                    f"prompt{loaded}, "
                    f"{o['output_tokens']} tokens) | {o['decode_tok_s']:.1f} (the default "
                    f"`--cpu-step {o['cpu_step']}`), {e['decode_tok_s']:.1f} (`--cpu-step eager`) "
                    f"| llama.cpp {p['decode_tok_s']:.1f}; roofline "
                    f"{r['roofline']['decode_tok_s']:.0f} | {r['ratio_decode']:.2f} / "
                    f"{r['ratio_decode_eager']:.2f} |")
        rows.append(f"| default model, 2-core CPU, time to first token (`--cpu-step "
                    f"{o['cpu_step']}`) | "
                    f"{o['ttft_s'] * 1000:.0f} ms | llama.cpp {p['ttft_s'] * 1000:.0f} ms | "
                    f"{r['ratio_ttft']:.2f} |")
        c = r["concurrency"]
        rows.append(f"| default model, 2-core CPU, aggregate decode at concurrency 8 vs serial "
                    f"(`--cpu-step {o['cpu_step']}`) | "
                    f"{c['concurrency_8_decode_tok_s']:.1f} tok/s | serial "
                    f"{c['serial_decode_tok_s']:.1f} | {c['ratio']:.2f} |")
    c = None if r else _load("cpu-concurrency.json")  # the default-model run measures it
    if c:
        top = max(c["levels"], key=lambda level: level["concurrency"])
        rows.append(f"| default model, 2-core CPU, aggregate decode at concurrency "
                    f"{top['concurrency']} vs serial | {top['aggregate_decode_tok_s']:.1f} tok/s | "
                    f"serial {c['serial']['decode_tok_s']:.1f} | "
                    f"{top['ratio_to_serial_decode']:.2f} |")
    z = _load("cpu-0.8b.json")
    runs = z["ninfer"] if z else []
    peer = z.get("peer") if z else None
    if runs and peer and "decode_tok_s" in peer:
        rows.append("| synthetic Qwen3.5-0.8B shape, 2-core CPU, batch-1 decode, the engine's step "
                    "(`--cpu-matmul` " + " / ".join(x["cpu_matmul"] for x in runs) + ") | "
                    + " / ".join(f"{x['decode_tok_s']:.1f}" for x in runs) + " tok/s | "
                    f"transformers {peer['decode_tok_s']:.1f} ({runs[0]['dtype']}); roofline "
                    + " / ".join(f"{x['roofline_decode_tok_s']:.1f}" for x in runs) + " | "
                    + " / ".join(f"{x['decode_tok_s'] / peer['decode_tok_s']:.2f}" for x in runs)
                    + "× transformers; "
                    + " / ".join(f"{x['decode_tok_s'] / x['roofline_decode_tok_s']:.0%}"
                                 for x in runs) + " of roofline |")
    return rows


def _cpu_short_prompt_rows() -> list[str]:
    """A short prompt's step on the CPU (a turn's new tokens after a prefix-cache hit) in the
    compiled C step against the eager forward (`bench/cpu_short_prompts.py`)."""
    r = _load("cpu-short-prompts.json")
    rows = []
    for row in r["rows"] if r else []:
        if row["tokens"] in (8, 32):
            rows.append(f"| default model, 2-core CPU, the step of a prompt of "
                        f"{row['tokens']} tokens (a turn's new tokens after a prefix hit), "
                        "compiled step | "
                        f"{row['c_step_ms']:.0f} ms | eager forward {row['eager_ms']:.0f} ms | "
                        f"{row['eager_ms'] / row['c_step_ms']:.2f}× |")
    return rows


def _cpu_ngram_rows() -> list[str]:
    """`--spec ngram` on the default model against `--spec` off, prompts whose answers repeat
    their context (`bench/cpu_spec_ngram.py`)."""
    r = _load("cpu-spec-ngram.json")
    if not r:
        return []
    names = list(r["speedup"])
    return [f"| default model, 2-core CPU, `--spec ngram` decode on answers that repeat their "
            f"context ({', '.join(names)}) | "
            + " / ".join(f"{r['ngram'][n]['decode_tok_s']:.0f}" for n in names) + " tok/s | "
            + "`--spec off` " + " / ".join(f"{r['off'][n]['decode_tok_s']:.0f}" for n in names)
            + " | " + " / ".join(f"{r['speedup'][n]:.2f}×" for n in names) + " |"]


def _gpu_rows() -> list[str]:
    rows = []
    for name, label in (("h200-ninfer-bench-27b.json", "27B dense shape, bf16"),
                        ("h200-ninfer-bench-27b-fp8.json", "27B dense shape, fp8-row weights"),
                        ("h200-ninfer-bench-27b-q4.json",
                         "27B dense shape, Q4/Q5 weights (recipe qwen3_6_27b) as served by "
                         "default (Q4/Q5 repacked into fp8 groups)"),
                        ("h200-ninfer-bench-27b-q4-packed.json",
                         "27B dense shape, Q4/Q5 weights kept packed as stored "
                         "(`--cuda-weights packed`)"),
                        ("h200-ninfer-bench-35b-a3b.json", "35B-A3B shape, bf16"),
                        ("h200-ninfer-bench-35b-a3b-fp8.json", "35B-A3B shape, fp8-row weights"),
                        ("h200-ninfer-bench-flash-next-fp8.json",
                         "80B-A3B (Flash-Next) shape, fp8-row weights"),
                        ("h200-ninfer-bench-27b-spec-shortlist.json", "27B dense shape, bf16"),
                        ("h100-ninfer-bench-27b-spec.json", "27B dense shape, bf16"),
                        ("h100-ninfer-bench-27b-spec-shortlist.json", "27B dense shape, bf16")):
        r = _load(name)
        if not r:
            continue
        gpu = name.split("-")[0].upper()  # the file's machine: h200-… or h100-…
        shortlist = r.get("lm_head_draft")  # a run of the drafting: its speculative row only
        d = r["decode"][0]
        peer = r.get("peer") or {}
        reference = f"roofline {d['roofline_tok_s']:.0f}"
        if "decode_tok_s" in peer:
            reference += f"; transformers {peer['decode_tok_s']:.1f}"
        how = ("`ninfer bench`: the engine's step" if r.get("path") else
               "`ninfer bench` of an earlier tree: the CUDA-graph replay alone")
        if not shortlist:
            rows.append(f"| {gpu}, {label}, batch-1 decode, {d['context'] // 1024}K context "
                        f"({how}) | {d['tok_s']:.1f} tok/s | {reference} | "
                        f"{100 * d['fraction_of_roofline']:.0f} % of roofline |")
        top = not shortlist and max(r.get("concurrency") or [{}],
                                    key=lambda c: c.get("concurrency", 0))
        if top:
            rows.append(f"| {gpu}, {label}, aggregate decode at concurrency {top['concurrency']} "
                        f"| {top['tok_s']:.0f} tok/s | roofline {top['roofline_tok_s']:.0f} | "
                        f"{100 * top['fraction_of_roofline']:.0f} % |")
        spec_rows = r.get("speculative") or []
        top_rate = max((spec["target_tokens_per_round"] for spec in spec_rows), default=None)
        for spec in spec_rows:  # the reference's MTP3 operating point (the .md has the others)
            if spec["target_tokens_per_round"] != top_rate:
                continue
            drafter = ("the MTP head's drafts, acceptance forced"
                       if r.get("spec_drafter") == "mtp" else "oracle drafter")
            if shortlist:
                drafter += f", `--lm-head-draft` over the head's first {shortlist:,} rows"
            rows.append(f"| {gpu}, {label}, speculative decode at {spec['tokens_per_round']:.2f} "
                        f"tokens a round (k={spec['draft_tokens']}, {drafter}), batch "
                        f"{spec['concurrency']} | {spec['tok_s']:.0f} tok/s | plain decode "
                        f"{spec['plain_tok_s']:.0f} | {spec['speedup']:.2f} |")
        # a later prefill-only run of the same shape (`*-prefill.json`) supersedes the row
        later = _load(name.removesuffix(".json") + "-prefill.json") or {}
        run = later if later.get("prefill") else r
        p = run.get("prefill")
        if p:
            rows.append(f"| {gpu}, {label}, prefill of a {p['tokens'] // 1024}K prompt "
                        f"({p['chunk']}-token chunks) | {p['tok_s']:.0f} tok/s | "
                        f"{p['achieved_tflops']:.0f} TFLOP/s of "
                        f"{run['machine']['matmul_tflops']:.0f} measured | "
                        f"{100 * p['fraction_of_matmul_rate']:.0f} % of matmul rate |")
    e = _load("h200-engine-decode.json")
    if e:
        peers = {p["shape"]: p for p in e["peer"]}
        for shape in e["results"]:
            one = shape["decode"][0]
            peer = peers.get(shape["shape"])
            reference = f"roofline {one['roofline_tok_s']:.0f}"
            ratio = f"{100 * one['fraction_of_roofline']:.0f} % of roofline"
            if peer:
                reference += f"; transformers {peer['tok_s']:.1f}"
                ratio += f", {one['tok_s'] / peer['tok_s']:.0f}× transformers"
            rows.append(f"| H200, {shape['shape']} shape, served decode step (engine, CUDA "
                        f"graphs), batch {one['batch']} | {one['tok_s']:.0f} tok/s | "
                        f"{reference} | {ratio} |")
    return rows


def _served_rows() -> list[str]:
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
        r = _load(name)
        if not r:
            continue
        levels = {run["label"]: {lv["concurrency"]: lv for lv in run["levels"]}
                  for run in r["runs"]}
        ours = levels.get("ninfer-after")
        peer_runs = _load(peer_file)["runs"] if peer_file else r["runs"]
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
        engine = (r.get("engine") or [None])[0] or _load(name.replace("served", "ninfer-bench"))
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


def _engine_process_rows() -> list[str]:
    """The engine in its own process against the engine in the HTTP process, and the 8-layer
    in-process server beside llama-server, one lease each (`bench/engine_process_ab.sh`)."""
    r = _load("h200-engine-process.json")
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


def _step_row_rows() -> list[str]:
    """Verify rows and mixed steps against the decode step (`bench/gpu_step_rows.py`)."""
    r = _load("h200-step-rows.json")
    rows = []
    for shape in r["results"] if r else []:
        for row in shape["rows"]:
            if row["batch"] != 1:
                continue
            name = f"H200, {shape['shape']} shape, {shape['recipe']}, batch 1"
            v = row["verify"]["3"]
            rows.append(f"| {name}, verify step of 1 + 3 tokens (speculative) | "
                        f"{v['ms']:.2f} ms | decode step {row['decode_ms']:.2f} ms | "
                        f"{v['over_decode']:.2f}× |")
            mx = row["mixed"]
            rows.append(f"| {name}, step of the decode row + a {mx['chunk']}-token prompt chunk "
                        f"| {mx['mixed_ms']:.1f} ms | decode step + chunk alone "
                        f"{row['decode_ms'] + mx['chunk_ms']:.1f} ms | "
                        f"{mx['over_separate']:.2f}× |")
    return rows


def _lookahead_rows() -> list[str]:
    """The engine's step with the lookahead step against the same step without it
    (`bench/profile_step.py --lookahead both`), quiet host only."""
    r = _load("h200-lookahead-step.json")
    rows = []
    for row in r["rows"] if r else []:
        if row["graph_alone_ms"] is None:
            continue
        rows.append(f"| H200, {row['shape']} shape, {row['weights']}, batch {row['batch']}, "
                    f"engine step with the lookahead step | {row['tok_s_on']:.0f} tok/s | "
                    f"without it {row['tok_s_off']:.0f}; graph replayed alone "
                    f"{1000 * row['batch'] / row['graph_alone_ms']:.0f} | "
                    f"{row['tok_s_on'] / row['tok_s_off']:.2f}× |")
    return rows


def _gemv_split_rows() -> list[str]:
    """The 27B's batch-1 engine step before and after the residual GEMVs' K split, alternating
    in one lease (`bench/profile_step.py`)."""
    r = _load("h200-27b-gemv-split.json")
    if not r:
        return []
    runs = r["leases"][-1]["runs"]
    trees: dict[str, list[float]] = {}
    for run in runs:
        trees.setdefault(run["tree"], []).append(run["tok_s"])
    before, after = runs[0]["tree"], runs[-1]["tree"]
    a, b = max(trees[after]), max(trees[before])
    return [f"| H200, 27b shape, bf16, batch 1, engine step with the lookahead step, tree {after} "
            f"| {a:.1f} tok/s | tree {before} {b:.1f} (alternating, one lease) | {a / b:.3f}× |"]


def _prompt_activation_rows() -> list[str]:
    """The 7,632-token prompt step (eight 1K prompts) with e4m3 against bf16 activations in the
    experts' GEMMs, processes in turn in one lease (`bench/prompt_burst.py`)."""
    r = _load("h200-prompt-burst-fp8-act.json")
    if not r:
        return []
    steps: dict[str, list[float]] = {}
    for run, result in r["engine_fp8_vs_bf16"].items():
        bursts = [b for b in result["bursts"] if len(b["first_token_ms"]) == 8][1:]
        steps.setdefault(run.split("-")[0], []).extend(b["steps"][0]["ms"] for b in bursts)
    fp8, bf16 = (statistics.median_high(steps[k]) for k in ("fp8", "bf16"))
    return [f"| H200, 35B-A3B shape cut to 8 layers, fp8-row, eight 1K-token prompts as one "
            f"7,632-token engine step, e4m3 activations in the experts' GEMMs (median of the "
            f"steady bursts) | {fp8:.1f} ms | bf16 activations {bf16:.1f} ms (in turn, one "
            f"lease) | {fp8 / bf16:.2f}× |"]


def _prompt_fp8_dense_rows() -> list[str]:
    """The fp8-row projections of a prompt step as e4m3 rows × codes against dequantized bf16:
    one 27B projection alone, and the 7,632-token engine step (`bench/fp8_dense_bench.py`,
    `bench/prompt_burst.py`, trees in turn in the same calls)."""
    r = _load("h100-prompt-fp8-dense.json")
    if not r:
        return []
    gu = next(x for x in r["microbench"] if x["projection"] == "mlp gate-up"
              and x["tokens"] == 7632)
    old, new = (statistics.median_high([ms for s in r["prompt_steps"] if s["tree"] == tree
                                        for ms in s["step_ms_7632"]]) for tree in ("old", "new"))
    bf16, fp8 = gu["dequant+bf16"]["us"], gu["fp8 scaled_mm"]["us"]
    return [f"| H100, 27B MLP gate\\|up projection (34,816 × 5,120), 7,632 prompt rows, e4m3 rows "
            f"× the fp8-row codes (`torch._scaled_mm`) | {fp8:,.0f} µs | dequantized to bf16 + "
            f"cuBLAS {bf16:,.0f} µs | {bf16 / fp8:.2f}× |",
            f"| H100, 35B-A3B shape cut to 8 layers, fp8-row, eight 1K-token prompts as one "
            f"7,632-token engine step, e4m3 rows in the projections too (median) | {new:.1f} ms "
            f"| projections in bf16 {old:.1f} ms (in turn, same calls) | {old / new:.2f}× |"]


def _moe_order_rows() -> list[str]:
    """The grouped expert GEMMs' launch order (a row tile's column tiles side by side) in the
    engine's 7,640-token prompt step on the H200, trees alternated in one call, and the 27B 8K
    prefill with the fp8 projections against the tree before them on the H100."""
    rows = []
    r = _load("h200-moe-grouped-order.json")
    if r:  # the warm bursts: each process's first is the slower one
        new, old = (statistics.median_high([b[0] for run in r["prompt_burst"][tree]
                                            for b in run["eight_955_steps_ms"][1:]])
                    for tree in ("new", "old"))
        rows.append(f"| H200, 35B-A3B shape cut to 8 layers, fp8-row, eight 1K-token prompts as "
                    f"one 7,640-token engine step, grouped expert GEMMs launched a row tile's "
                    f"columns side by side (median) | {new:.1f} ms | row tiles first {old:.1f} ms "
                    f"(trees alternated, one call) | {old / new:.2f}× |")
    r = _load("h100-moe-grouped-order.json")
    if r:
        p = r["prefill_8192"]["27b"]
        rows.append(f"| H100, 27B dense shape, fp8-row, prefill of an 8K prompt (4096-token "
                    f"chunks), e4m3 rows in the projections | {p['new']['ms']:.0f} ms | bf16 "
                    f"projections (tree before) {p['pre-fp8']['ms']:.0f} ms, same call | "
                    f"{p['pre-fp8']['ms'] / p['new']['ms']:.2f}× |")
    return rows


def _gdn_prompt_rows() -> list[str]:
    """A prompt step's GDN launches, one layer, this stop's tree against the last
    (`bench/gdn_prompt_parts.py`), and the 7,632-token engine step they sit in
    (`bench/prompt_burst.py`, processes in turn in one lease)."""
    r = _load("h200-gdn-prompt-parts.json")
    if not r:
        return []
    first, last = r["parts"][0], r["parts"][-1]

    def layer_ms(run: dict, shape: str) -> float:  # each launch's variant the engine runs
        parts = next(s for s in run["shapes"] if s["shape"] == shape)["parts"]
        chosen = run.get("engine_variants", {})
        return sum(next(r for r in rows if chosen.get(part, r).items() <= r.items())["ms"]
                   for part, rows in parts.items())

    rows = []
    for shape in ("35B-A3B 8x955", "27B 1x8192"):
        a, b = layer_ms(last, shape), layer_ms(first, shape)
        rows.append(f"| H200, {shape.replace('x', ' × ')}-token prompt step, one GDN layer's "
                    f"launches (conv prep, chunk precompute, chunk walk, gated norm), tree "
                    f"{last['tree']} | {a:.2f} ms | tree {first['tree'].split()[0]} {b:.2f} "
                    f"(one lease each) | {a / b:.2f}× |")
    steps: dict[str, list[float]] = {}
    for run, bursts in r["engine_bursts_call_J"].items():
        if run.startswith("burst-"):  # the 35B-A3B runs; burst27-* are the 27B's
            big = [max(b["steps"], key=lambda s: s["prompt_tokens"])["ms"]
                   for b in bursts if b["rows"] == 8][1:]
            steps.setdefault(run.split("-")[1], []).extend(big)
    new, old = (statistics.median_high(steps[k]) for k in ("new", "old"))
    rows.append(f"| H200, 35B-A3B shape cut to 8 layers, fp8-row, eight 1K-token prompts as one "
                f"7,632-token engine step (median of the steady bursts), tree d644a8b | "
                f"{new:.1f} ms | tree 8dbc18e {old:.1f} (in turn, one lease) | "
                f"{new / old:.2f}× |")
    return rows


def _verify_rows() -> list[str]:
    """A B=1 verify step of 1 + 3 tokens against a decode step, each shape's own
    (`bench/profile_step.py --spec 3`), the engine step and its CUDA graph alone."""
    r = _load("h200-verify-step.json")
    if not r:
        return []
    f, g = r["lease_F"], r["lease_G"]
    rows = []
    for shape, name, verify, where in (
            ("35B-A3B", "35b-a3b", g["new"],
             "verify: tree 3f428ef; decode: 6b53bbc, another lease"),
            ("27B", "27b", f["27b-spec3"], "tree 6b53bbc, one lease")):
        decode = f[f"{name}-spec0"]
        step, replay = (verify[k] / decode[k] for k in ("step_ms", "replay_ms"))
        rows.append(f"| H200, {shape} shape, batch 1, a verify step of 1 + 3 tokens against a "
                    f"decode step ({where}; engine step; the CUDA graph alone) | "
                    f"{verify['step_ms']:.2f} ms; {verify['replay_ms']:.2f} ms | decode "
                    f"{decode['step_ms']:.2f} ms; {decode['replay_ms']:.2f} ms | "
                    f"{step:.2f}×; {replay:.2f}× |")
    r = _load("h100-verify-gemv-step.json")
    if r:  # the same 35B-A3B pair on the H100, in one call (C), after the GEMV launch change
        runs = {run["name"]: run for run in r["runs"]}
        verify, decode = runs["C-verify-tree-be5756d"], runs["C-decode-tree-be5756d"]
        rows.append(f"| H100, 35B-A3B shape, batch 1, a verify step of 1 + 3 tokens against a "
                    f"decode step (tree be5756d, one call; engine step; the CUDA graph alone) | "
                    f"{verify['engine_step_ms']:.2f} ms; {verify['graph_alone_ms']:.2f} ms | "
                    f"decode {decode['engine_step_ms']:.2f} ms; {decode['graph_alone_ms']:.2f} ms "
                    f"| {verify['engine_step_ms'] / decode['engine_step_ms']:.2f}×; "
                    f"{verify['graph_alone_ms'] / decode['graph_alone_ms']:.2f}× |")
    return rows


def _llama_step_rows() -> list[str]:
    """The llama family's verify rows and short prompt chunks as CUDA graphs against the eager
    forward they replaced, with the decode graph step beside (bench/gpu_engine_decode.py); the
    latest call's rows."""
    r = _load("h100-issue-bounds-after-fix.json")
    if not r:
        return []
    rows = []
    for shape in r["llama"]["results"]:
        for d in shape["decode"]:
            rows.append(
                f"| H100, {shape['shape']} shape, batch {d['batch']}, a verify step of 1 + "
                f"{d['verify']} tokens a row / a {d['prompt']}-token prompt chunk over "
                f"{d['context'] // 1024}K of context, each replayed as a CUDA graph | "
                f"{d['verify_graph_ms']:.2f} / {d['prompt_graph_ms']:.2f} ms | the decode graph "
                f"step {d['graph_step_ms']:.2f} ms; the eager forward {d['verify_eager_ms']:.1f} "
                f"/ {d['prompt_eager_ms']:.1f} ms (same run) | "
                f"{d['verify_graph_ms'] / d['graph_step_ms']:.2f}× the decode step; "
                f"{d['verify_eager_ms'] / d['verify_graph_ms']:.1f}× / "
                f"{d['prompt_eager_ms'] / d['prompt_graph_ms']:.1f}× faster than eager |")
    return rows


def _policy_rows() -> list[str]:
    """`ninfer bench`'s speculative section under the engine's policy (oracle drafts at a
    forced rate), against plain decode in the same run."""
    r = _load("h100-spec-policy-lookahead.json")
    if not r:
        return []
    return [f"| H100, 35B-A3B shape, batch {a['concurrency']}, oracle drafts at "
            f"{a['target_tokens_per_round']} tokens a round, under the speculation policy "
            f"(`ninfer bench`) | {a['policy_tok_s']:.0f} tok/s | `--spec off` "
            f"{a['plain_tok_s']:.0f} tok/s | {a['policy_speedup']:.2f}× |" for a in r["after"]]


# `--spec mtp` step runs (bench/step_logs_table.py files): file, machine and shape, the run
# with drafts, the plain run, what drafts over
MTP_RUNS = (("h200-mtp-graph-round.json", "H200, 35B-A3B shape", "mtp-ahead", "decode",
             "the whole fp8-row head"),
            ("h100-27b-mtp-draft-head.json", "H100, 27B dense shape, bf16", "27b-mtp-shortlist",
             "27b-decode", "`--lm-head-draft`'s 131,072-row shortlist as fp8-row codes"))


def _mtp_rows() -> list[str]:
    """`--spec mtp` at B=1 as served (drafts by the MTP head, the graphed draft round, the
    verify chain, rounds launched ahead), against plain decode in the same call."""
    rows = []
    for name, what, drafted, plain_run, over in MTP_RUNS:
        r = _load(name)
        if not r:
            continue
        runs = {run["name"]: run for run in r["runs"]}
        mtp, plain = runs[drafted], runs[plain_run]
        rows.append(f"| {what}, batch 1, `--spec mtp` decode at {mtp['tokens_per_round']:.2f} "
                    f"tokens a round, drafting over {over} (acceptance forced; engine step, "
                    f"tree {r['meta']['tree']}) | {mtp['tok_s']:.0f} tok/s "
                    f"({mtp['engine_step_ms']:.2f} ms a round) | `--spec off` "
                    f"{plain['tok_s']:.0f} tok/s | {mtp['tok_s'] / plain['tok_s']:.2f}× |")
    return rows


def _mask_rows() -> list[str]:
    """Grammar mask time the engine step exposes at B = 8 (`bench/mask_cost.py`), this stop's
    tree against the last in the same lease."""
    r = _load("h200-mask-overlap-ab.json")
    if not r:
        return []

    def share(result: dict, forward: float) -> float:
        row = next(e for e in result["exposed"] if e["batch"] == 8 and e["run"] == "on"
                   and e["forward_ms"] == forward)
        return 100 * row["exposed"]["mean_ms"] / row["step"]["mean_ms"]

    last = [run for run in r["runs"] if run["lease"] == r["runs"][-1]["lease"]]
    before = next(run for run in last if run["note"] == "before this stop")
    after = [run for run in last if run is not before]
    return [f"| H200, json_schema grammar on 8 rows (Qwen3.5 vocabulary), mask fill exposed "
            f"per decode step of {ms:g} ms, tree {after[0]['tree'].split()[0]} | "
            + " / ".join(f"{share(run['result'], ms):.1f} %" for run in after)
            + f" | tree {before['tree']} {share(before['result'], ms):.1f} % | target < 5 % |"
            for ms in (5.0, 2.0)]


def _agent_replay_rows() -> list[str]:
    """The prefix cache under an agent workload (`bench/agent_replay.py`), its three modes
    replayed in one run."""
    r = _load("h200-agent-replay-35b-a3b.json")
    if not r:
        return []
    a, modes = r["args"], r["modes"]
    off, host = modes["cache off"], modes["device + host"]
    what = (f"H200, 35B-A3B shape cut to {a['layers']} layers, agent replay ({a['agents']} "
            f"conversations x {a['turns']} turns, a shared {a['system']}-token system prompt), "
            "prefix cache with its host tier")
    return [f"| {what}: TTFT p50 | {host['ttft_p50_s'] * 1000:.0f} ms | cache off "
            f"{off['ttft_p50_s'] * 1000:.0f} ms | {off['ttft_p50_s'] / host['ttft_p50_s']:.1f}× |",
            f"| {what}: prompt tokens computed | {host['computed']:,} | cache off "
            f"{off['computed']:,} | {host['computed'] / off['computed']:.3f} |"]


def _host_tier_rows() -> list[str]:
    """A turn whose long prefix was pushed out to the host tier (`bench/host_tier_ttft.py`)."""
    r = _load("h200-host-tier-ttft-35b-a3b.json")
    if not r:
        return []
    tier = r["rows"]["device + host tier"]
    what = (f"H200, 35B-A3B shape cut to {r['layers']} layers, TTFT of a {r['turn_tokens']}-token "
            f"turn after its {r['prompt_tokens']}-token prefix was evicted, restored from the "
            "host tier (medians of 3 passes)")
    return [f"| {what} | {tier['after_eviction_ttft_s'] * 1000:.0f} ms | cold prefill "
            f"{tier['cold_ttft_s'] * 1000:.0f} ms | {tier['speedup_vs_cold']:.1f}× |"]


def _expert_offload_rows() -> list[str]:
    """Routed experts in host RAM, Flash-Next cut to 16 layers (`bench/expert_offload.py`):
    B=1 at a quarter, half and 80 % of the experts off the device against every expert on it
    (the same call's), per routing; `--expert-cpu-share auto` against none (one call); half of
    each layer-step's misses on the host's cores (H100, one machine's calls); and
    llama.cpp's `-ncmoe` beside ours in one call (`bench/offload_peer_table.py`, an older
    tree of ours)."""
    peer, r = _load("h200-expert-offload-peer.json"), _load("h200-expert-offload-all.json")
    auto = _load("h200-expert-offload-cpu-auto.json")
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
    split = _load("h100-expert-offload-split-auto.json")
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
    ceiling = _load("h200-expert-offload-ceiling.json")
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
    if peer:
        for row in peer["rows"][1:]:
            rows.append(f"| {shape}, batch 1, {row['ours_share']:.0%} of the routed experts in "
                        f"host RAM (uniform; skewed routing), ours fp8-row (stop 43's tree) "
                        f"against llama.cpp Q8_0 `-ncmoe {row['n_cpu_moe']}` (one call) | "
                        f"{row['ours_uniform_tok_s']:.0f}; {row['ours_skewed_tok_s']:.0f} tok/s "
                        f"| llama.cpp {row['llama_tok_s']:.0f} | {row['ratio_uniform']:.2f}×; "
                        f"{row['ratio_skewed']:.2f}× |")
    return rows


def _gdn_tiles_and_burst_rows() -> list[str]:
    """The GDN prompt tiles in bf16 against fp32 in the engine's 7,640-token prompt step, and
    the served TTFT of eight 1K-token prompts arriving together against one alone, both on the
    H100 (`bench/gdn_tiles_device.sh`, `bench/ttft_burst_device.sh`)."""
    rows = []
    r = _load("h100-gdn-bf16-tiles.json")
    if r:  # the warm bursts: each process's first is the slower one
        bf16, fp32 = (statistics.median([b["steps_ms"][0] for run, bursts in
                                         r["prompt_burst"].items() if run.endswith(tiles)
                                         for b in [x for x in bursts if x["burst"] == 8][1:]])
                      for tiles in ("bf16", "fp32"))
        rows.append(f"| H100, 35B-A3B shape cut to 8 layers, fp8-row, eight 1K-token prompts as "
                    f"one 7,640-token engine step, GDN precompute tiles in bf16 (median) | "
                    f"{bf16:.1f} ms | fp32 tiles {fp32:.1f} ms (in turn, one call) | "
                    f"{fp32 / bf16:.2f}× |")
    r = _load("h100-prompt-step-gdn-bf16-slot-sum.json")
    if r:  # device busy time under the profiler: the lease's host noise hid the wall-time gain
        new, old = (r["profiled"][t]["prompt_step_busy_ms"] for t in ("new", "old"))
        rows.append(f"| H100, 35B-A3B shape cut to 8 layers, fp8-row, eight 1K-token prompts as "
                    f"one 7,640-token engine step, device busy time: GDN q/k/v and walk output "
                    f"in bf16, the MoE slot sum with the residual in one pass | {new:.2f} ms | "
                    f"tree {r['trees']['old'].split()[0]} {old:.2f} ms (one lease) | "
                    f"{new / old:.2f}× |")
    # (file, the server's runs in it, what the row says of them); the depth is the file's title's
    for name, server, how in (
            ("h100-ttft-burst-handover.json", "-p8192", "`--prefill-chunk 8192`, the auto value "
             "there"),
            ("h100-ttft-burst-auto.json", "", "auto chunk, another lease, slower host"),
            ("h100-ttft-burst-stamped.json", "", "auto chunk, tokens stamped on the host"),
            ("h100-ttft-burst-40l.json", "", "auto chunk, same call as the row above"),
            ("h100-ttft-burst-threads.json", "", "a thread per prompt's encoding, every decode "
             "graph captured at load; two servers"),
            ("h100-ttft-burst-turn.json", "", "same call, servers alternated with the row "
             "above: the batching prompt encoder before it"),
            ("h100-ttft-burst-40l-threads.json", "", "as two rows above, the next call")):
        r = _load(name)
        if not r:
            continue
        depth = r["meta"]["title"].split("35B-A3B shape ")[1].split(", fp8-row")[0]
        ours = [b for b in r["bursts"] if run_key(b["label"])[0] == server]
        c8 = [b["ttft_p99_s"] * 1e3 for b in ours if b["concurrency"] == 8]
        c1 = [b["ttft_median_s"] * 1e3 for b in ours if b["concurrency"] == 1]
        each = [v["p99_c8_over_median_c1"]
                for v in ratios({b["label"]: b for b in ours}).values()]
        rows.append(f"| H100, 35B-A3B shape {depth}, fp8-row, served: TTFT p99 of eight "
                    f"1K-token prompts arriving together ({how}; {len(c8)} rounds) | "
                    f"{min(c8):.1f}-{max(c8):.1f} ms | one at a time, median "
                    f"{min(c1):.1f}-{max(c1):.1f} ms | {min(each):.2f}-{max(each):.2f}× by round "
                    f"(issue 18: ≤ 2) |")
    return rows


def table() -> str:
    head = "| what | ninfer | reference (same run) | ratio |\n|---|---:|---:|---:|\n"
    return head + "\n".join(_cpu_rows() + _cpu_short_prompt_rows() + _cpu_ngram_rows() + _gpu_rows()
                             + _lookahead_rows() + _gemv_split_rows() + _prompt_activation_rows()
                             + _prompt_fp8_dense_rows() + _moe_order_rows()
                             + _gdn_prompt_rows() + _gdn_tiles_and_burst_rows()
                             + _step_row_rows() + _verify_rows() + _llama_step_rows()
                             + _policy_rows() + _mtp_rows() + _mask_rows()
                             + _engine_process_rows() + _served_rows()
                             + _agent_replay_rows() + _host_tier_rows()
                             + _expert_offload_rows()) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = README.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    updated = text[:start] + "\n" + table() + text[end:]
    if args.check:
        return 0 if updated == text else 1
    README.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
