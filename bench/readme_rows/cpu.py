"""The CPU rows: the default model's decode and prompts, short prompts, `--spec ngram`,
grammar masks, an agent's replayed session."""
from __future__ import annotations

from . import load


def cpu_rows() -> list[str]:
    rows = []
    r = load("cpu-default-model.json")
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
    c = None if r else load("cpu-concurrency.json")  # the default-model run measures it
    if c:
        top = max(c["levels"], key=lambda level: level["concurrency"])
        rows.append(f"| default model, 2-core CPU, aggregate decode at concurrency "
                    f"{top['concurrency']} vs serial | {top['aggregate_decode_tok_s']:.1f} tok/s | "
                    f"serial {c['serial']['decode_tok_s']:.1f} | "
                    f"{top['ratio_to_serial_decode']:.2f} |")
    z = load("cpu-0.8b.json")
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


def cpu_short_prompt_rows() -> list[str]:
    """A short prompt's step on the CPU (a turn's new tokens after a prefix-cache hit) in the
    compiled C step against the eager forward (`bench/cpu_short_prompts.py`)."""
    r = load("cpu-short-prompts.json")
    rows = []
    for row in r["rows"] if r else []:
        if row["tokens"] in (8, 32):
            rows.append(f"| default model, 2-core CPU, the step of a prompt of "
                        f"{row['tokens']} tokens (a turn's new tokens after a prefix hit), "
                        "compiled step | "
                        f"{row['c_step_ms']:.0f} ms | eager forward {row['eager_ms']:.0f} ms | "
                        f"{row['eager_ms'] / row['c_step_ms']:.2f}× |")
    return rows


def cpu_ngram_rows() -> list[str]:
    """`--spec ngram` on the default model against `--spec` off, prompts whose answers repeat
    their context (`bench/cpu_spec_ngram.py`)."""
    r = load("cpu-spec-ngram.json")
    if not r:
        return []
    names = list(r["speedup"])
    return [f"| default model, 2-core CPU, `--spec ngram` decode on answers that repeat their "
            f"context ({', '.join(names)}) | "
            + " / ".join(f"{r['ngram'][n]['decode_tok_s']:.0f}" for n in names) + " tok/s | "
            + "`--spec off` " + " / ".join(f"{r['off'][n]['decode_tok_s']:.0f}" for n in names)
            + " | " + " / ".join(f"{r['speedup'][n]:.2f}×" for n in names) + " |"]


def mask_rows() -> list[str]:
    """Grammar mask time the engine step exposes at B = 8 (`bench/mask_cost.py`), this stop's
    tree against the last in the same lease."""
    r = load("h200-mask-overlap-ab.json")
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


def agent_replay_rows() -> list[str]:
    """The prefix cache under an agent workload (`bench/agent_replay.py`), its three modes
    replayed in one run."""
    r = load("h200-agent-replay-35b-a3b.json")
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
