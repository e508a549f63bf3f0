"""The GPU prompt steps: activations, fp8 dense GEMMs, the MoE order, GDN prompt kernels, GDN
tiles and TTFT bursts."""
from __future__ import annotations

import statistics

from ttft_burst_table import ratios, run_key  # (bench/: the script's folder on sys.path)

from . import load


def prompt_activation_rows() -> list[str]:
    """The 7,632-token prompt step (eight 1K prompts) with e4m3 against bf16 activations in the
    experts' GEMMs, processes in turn in one lease (`bench/prompt_burst.py`)."""
    r = load("h200-prompt-burst-fp8-act.json")
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


def prompt_fp8_dense_rows() -> list[str]:
    """The fp8-row projections of a prompt step as e4m3 rows × codes against dequantized bf16:
    one 27B projection alone, and the 7,632-token engine step (`bench/fp8_dense_bench.py`,
    `bench/prompt_burst.py`, trees in turn in the same calls)."""
    r = load("h100-prompt-fp8-dense.json")
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


def moe_order_rows() -> list[str]:
    """The grouped expert GEMMs' launch order (a row tile's column tiles side by side) in the
    engine's 7,640-token prompt step on the H200, trees alternated in one call, and the 27B 8K
    prefill with the fp8 projections against the tree before them on the H100."""
    rows = []
    r = load("h200-moe-grouped-order.json")
    if r:  # the warm bursts: each process's first is the slower one
        new, old = (statistics.median_high([b[0] for run in r["prompt_burst"][tree]
                                            for b in run["eight_955_steps_ms"][1:]])
                    for tree in ("new", "old"))
        rows.append(f"| H200, 35B-A3B shape cut to 8 layers, fp8-row, eight 1K-token prompts as "
                    f"one 7,640-token engine step, grouped expert GEMMs launched a row tile's "
                    f"columns side by side (median) | {new:.1f} ms | row tiles first {old:.1f} ms "
                    f"(trees alternated, one call) | {old / new:.2f}× |")
    r = load("h100-moe-grouped-order.json")
    if r:
        p = r["prefill_8192"]["27b"]
        rows.append(f"| H100, 27B dense shape, fp8-row, prefill of an 8K prompt (4096-token "
                    f"chunks), e4m3 rows in the projections | {p['new']['ms']:.0f} ms | bf16 "
                    f"projections (tree before) {p['pre-fp8']['ms']:.0f} ms, same call | "
                    f"{p['pre-fp8']['ms'] / p['new']['ms']:.2f}× |")
    return rows


def gdn_prompt_rows() -> list[str]:
    """A prompt step's GDN launches, one layer, this stop's tree against the last
    (`bench/gdn_prompt_parts.py`), and the 7,632-token engine step they sit in
    (`bench/prompt_burst.py`, processes in turn in one lease)."""
    r = load("h200-gdn-prompt-parts.json")
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


def gdn_tiles_and_burst_rows() -> list[str]:
    """The GDN prompt tiles in bf16 against fp32 in the engine's 7,640-token prompt step, and
    the served TTFT of eight 1K-token prompts arriving together against one alone, both on the
    H100 (`bench/gdn_tiles_device.sh`, `bench/ttft_burst_device.sh`)."""
    rows = []
    r = load("h100-gdn-bf16-tiles.json")
    if r:  # the warm bursts: each process's first is the slower one
        bf16, fp32 = (statistics.median([b["steps_ms"][0] for run, bursts in
                                         r["prompt_burst"].items() if run.endswith(tiles)
                                         for b in [x for x in bursts if x["burst"] == 8][1:]])
                      for tiles in ("bf16", "fp32"))
        rows.append(f"| H100, 35B-A3B shape cut to 8 layers, fp8-row, eight 1K-token prompts as "
                    f"one 7,640-token engine step, GDN precompute tiles in bf16 (median) | "
                    f"{bf16:.1f} ms | fp32 tiles {fp32:.1f} ms (in turn, one call) | "
                    f"{fp32 / bf16:.2f}× |")
    r = load("h100-prompt-step-gdn-bf16-slot-sum.json")
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
        r = load(name)
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
