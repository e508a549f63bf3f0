"""The GPU decode, verify and speculative steps: the engine's step beside its peers, the
lookahead step, GEMV splits, step rows, verify steps, the llama family's captured steps, the
speculation policy and MTP rounds."""
from __future__ import annotations

from . import load


def gpu_rows() -> list[str]:
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
        r = load(name)
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
        later = load(name.removesuffix(".json") + "-prefill.json") or {}
        run = later if later.get("prefill") else r
        p = run.get("prefill")
        if p:
            rows.append(f"| {gpu}, {label}, prefill of a {p['tokens'] // 1024}K prompt "
                        f"({p['chunk']}-token chunks) | {p['tok_s']:.0f} tok/s | "
                        f"{p['achieved_tflops']:.0f} TFLOP/s of "
                        f"{run['machine']['matmul_tflops']:.0f} measured | "
                        f"{100 * p['fraction_of_matmul_rate']:.0f} % of matmul rate |")
    e = load("h200-engine-decode.json")
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


def lookahead_rows() -> list[str]:
    """The engine's step with the lookahead step against the same step without it
    (`bench/profile_step.py --lookahead both`), quiet host only."""
    r = load("h200-lookahead-step.json")
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


def gemv_split_rows() -> list[str]:
    """The 27B's batch-1 engine step before and after the residual GEMVs' K split, alternating
    in one lease (`bench/profile_step.py`)."""
    r = load("h200-27b-gemv-split.json")
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


def step_row_rows() -> list[str]:
    """Verify rows and mixed steps against the decode step (`bench/gpu_step_rows.py`)."""
    r = load("h200-step-rows.json")
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


def verify_rows() -> list[str]:
    """A B=1 verify step of 1 + 3 tokens against a decode step, each shape's own
    (`bench/profile_step.py --spec 3`), the engine step and its CUDA graph alone."""
    r = load("h200-verify-step.json")
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
    r = load("h100-verify-gemv-step.json")
    if r:  # the same 35B-A3B pair on the H100, in one call (C), after the GEMV launch change
        runs = {run["name"]: run for run in r["runs"]}
        verify, decode = runs["C-verify-tree-be5756d"], runs["C-decode-tree-be5756d"]
        rows.append(f"| H100, 35B-A3B shape, batch 1, a verify step of 1 + 3 tokens against a "
                    f"decode step (tree be5756d, one call; engine step; the CUDA graph alone) | "
                    f"{verify['engine_step_ms']:.2f} ms; {verify['graph_alone_ms']:.2f} ms | "
                    f"decode {decode['engine_step_ms']:.2f} ms; {decode['graph_alone_ms']:.2f} ms "
                    f"| {verify['engine_step_ms'] / decode['engine_step_ms']:.2f}×; "
                    f"{verify['graph_alone_ms'] / decode['graph_alone_ms']:.2f}× |")
    r = load("h100-issue-bounds-71d78f1.json")
    if r:  # the same pair, both acceptance paths, and the MTP round (bench/step_logs_table.py)
        runs = {run["name"]: run for run in r["runs"]}
        decode = runs["35b-decode"]
        for name, what in (("35b-verify", "a verify step of 1 + 3 tokens (oracle drafts, host "
                                          "acceptance)"),
                           ("35b-verify-free", "a verify step of 1 + 3 tokens (the device "
                                               "chain, drafting taken out: `--drafter free`)"),
                           ("35b-mtp", "a `--spec mtp` round (the device chain, launched "
                                       "ahead, `--lm-head-draft` 131,072 rows)")):
            step = runs[name]
            rows.append(f"| H100, 35B-A3B shape, batch 1, {what} against a decode step (tree "
                        f"{r['meta']['tree']}, one call; engine step; the CUDA graph alone) | "
                        f"{step['engine_step_ms']:.2f} ms; {step['graph_alone_ms']:.2f} ms "
                        f"({step['tok_s']:.0f} tok/s at {step['tokens_per_round']:.2f} tokens "
                        f"a round) | decode {decode['engine_step_ms']:.2f} ms; "
                        f"{decode['graph_alone_ms']:.2f} ms | "
                        f"{step['engine_step_ms'] / decode['engine_step_ms']:.2f}×; "
                        f"{step['graph_alone_ms'] / decode['graph_alone_ms']:.2f}× |")
    return rows


def llama_step_rows() -> list[str]:
    """The llama family's verify rows and short prompt chunks as CUDA graphs against the eager
    forward they replaced, with the decode graph step beside (bench/gpu_engine_decode.py); the
    latest call's rows."""
    r = load("h100-issue-bounds-71d78f1.json")
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


def policy_rows() -> list[str]:
    """`ninfer bench`'s speculative section under the engine's policy (oracle drafts at a
    forced rate), against plain decode in the same run."""
    r = load("h100-spec-policy-lookahead.json")
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


def mtp_rows() -> list[str]:
    """`--spec mtp` at B=1 as served (drafts by the MTP head, the graphed draft round, the
    verify chain, rounds launched ahead), against plain decode in the same call."""
    rows = []
    for name, what, drafted, plain_run, over in MTP_RUNS:
        r = load(name)
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
