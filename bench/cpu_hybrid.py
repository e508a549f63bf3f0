"""Decode and prefill speed of a synthetic Qwen3.5-0.8B-shape model on this machine's CPU.

    .venv/bin/python bench/cpu_hybrid.py [--dtype float32] [--batch 1] [--threads 1]
                                         [--cpu-matmul fp32,bf16,int8]

Random weights at the real shapes (`artifact.synth.build_synthetic`, no file) in the engine
that serves them (`benchmark.engine_step.bench_engine`: `Engine.step` timed, scheduler, runner
and sampler; KV bf16, no prefix reuse). A 128-token prompt per request is prefilled, then
`--steps` greedy decode steps over the whole batch, for each `--cpu-matmul` (the decode
projections' and head's narrowed copies, as `ninfer-serve --cpu-matmul` serves them) in turn,
in one process.
Writes bench/results/cpu-0.8b.{json,md}.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.cpu_default_model import memory_bandwidth  # noqa: E402
from bench.report import cpu_machine, write_report  # noqa: E402
from ninfer_engine.artifact.synth import build_synthetic, synth_config  # noqa: E402
from ninfer_engine.benchmark.engine_step import (  # noqa: E402
    bench_engine, random_prompts, run_requests)
from ninfer_engine.benchmark.peer import run_peer  # noqa: E402
from ninfer_engine.models import Qwen35Model  # noqa: E402
from ninfer_engine.serving import MATMUL_DTYPES  # noqa: E402

PROMPT_TOKENS = 128


def run(args: argparse.Namespace, cpu_matmul: str) -> dict:
    """The engine's own step (`Engine.step`: scheduler, runner, sampler) over the model with
    `cpu_matmul`'s decode copies: `--batch` prompts prefilled, then `--steps` decode steps."""
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    config, params = build_synthetic("0.8b", "cpu", dtype, seed=0)
    model = Qwen35Model(config, params, MATMUL_DTYPES[cpu_matmul])
    load_s = time.perf_counter() - start
    engine = bench_engine(model, "0.8b", config, args.batch,
                          PROMPT_TOKENS + args.steps + args.warmup + 8)
    prompts = random_prompts(args.batch, PROMPT_TOKENS, config["vocab_size"])
    with torch.inference_mode():
        run = run_requests(engine, prompts, args.steps + args.warmup + 1)
    prefill_s = sum(dt for dt, full in zip(run.step_s, run.full_decode) if not full)
    tokens, decode_s = run.decode_window(args.warmup)
    measured = [dt for dt, full in zip(run.step_s, run.full_decode) if full][args.warmup:]
    return {
        "dtype": args.dtype, "cpu_matmul": cpu_matmul, "batch": args.batch,
        "prompt_tokens": PROMPT_TOKENS, "decode_steps": len(measured), "warmup_steps": args.warmup,
        "weights_gib": model.weight_bytes() / 2**30, "build_s": load_s,
        # every projection's and the head's matrix, or its copy; the rest is ~0.1 %
        "decode_step_bytes": sum(p.narrow_bytes or p.weight.nbytes for p in model.projections),
        "prefill_tok_s": args.batch * PROMPT_TOKENS / prefill_s,
        "decode_tok_s": tokens / decode_s,
        "decode_step_ms_median": sorted(measured)[len(measured) // 2] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; on a shared box OpenMP barriers stall extra threads")
    parser.add_argument("--cpu-matmul", default="fp32",
                        help="comma-separated: fp32, bf16, int8 (each measured in turn)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu-0.8b")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = [run(args, m) for m in args.cpu_matmul.split(",")]
    bandwidth = memory_bandwidth(args.threads)
    for x in runs:
        x["roofline_decode_tok_s"] = bandwidth / x["decode_step_bytes"]
    # transformers' own greedy loop and cache over the same shape, batch 1
    peer = (run_peer(synth_config("0.8b"), PROMPT_TOKENS, args.steps, device="cpu",
                     dtype=getattr(torch, args.dtype)) if args.batch == 1 else None)
    result = {
        "benchmark": "cpu-0.8b",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/cpu_hybrid.py " + " ".join(sys.argv[1:]),
        "machine": cpu_machine(load_average_1m=os.getloadavg()[0]),
        "model": "synthetic Qwen3.5-0.8B shape (24 layers, 18 GDN : 6 attention, random weights)",
        "ninfer": runs,
        "peer": peer,
        "bandwidth_gb_s": bandwidth / 1e9,
    }
    write_report(args.out, result, markdown)
    return 0


def markdown(r: dict) -> str:
    m, runs = r["machine"], r["ninfer"]
    n, base = runs[0], runs[0]["decode_tok_s"]
    return (
        f"# Synthetic Qwen3.5-0.8B on the CPU ({r['date'][:10]})\n\n"
        f"Machine: {m['cpu']}, {m['cores']} cores, shared with other jobs while measured (1-min "
        f"load average {m['load_average_1m']:.1f}), "
        f"torch {m['torch']} ({m['torch_threads']} threads). Command: `{r['command']}`. "
        f"Model: {r['model']}; weights {n['dtype']}, KV bf16, batch {n['batch']}, "
        f"{n['prompt_tokens']}-token prompt, "
        f"{n['decode_steps']} timed decode steps after {n['warmup_steps']} warm-up steps. "
        "The engine's own step (`Engine.step`) on the torch reference path (no Triton, no CUDA "
        "graphs); "
        "`--cpu-matmul` gives the decode projections and the head narrowed copies (weights "
        "held: the float32 weights and those copies). Roofline: the bytes a decode step "
        "streams (every projection's and the head's matrix, or its copy) at the "
        f"{r['bandwidth_gb_s']:.1f} GB/s an fp32 sum over 256 MiB reached here.\n\n"
        "| `--cpu-matmul` | weights held GiB | prefill tok/s | decode tok/s | decode step "
        f"(median) | decode vs {n['cpu_matmul']} | roofline tok/s (step GiB) | of roofline |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n"
        + "".join(f"| {x['cpu_matmul']} | {x['weights_gib']:.2f} | {x['prefill_tok_s']:.1f} | "
                  f"{x['decode_tok_s']:.2f} | {x['decode_step_ms_median']:.0f} ms | "
                  f"{x['decode_tok_s'] / base:.2f}× | {x['roofline_decode_tok_s']:.1f} "
                  f"({x['decode_step_bytes'] / 2**30:.2f}) | "
                  f"{x['decode_tok_s'] / x['roofline_decode_tok_s']:.0%} |\n" for x in runs)
        + (f"| transformers {p['version']} (its own greedy loop and cache, {n['dtype']}) | | "
           f"{p['prefill_tok_s']:.1f} | {p['decode_tok_s']:.2f} | "
           f"{1e3 / p['decode_tok_s']:.0f} ms | {p['decode_tok_s'] / base:.2f}× | | |\n"
           if "decode_tok_s" in (p := r.get("peer") or {}) else "")
    )


if __name__ == "__main__":
    sys.exit(main())
