"""Decode and prefill speed of a synthetic Qwen3.5-0.8B-shape model on this machine's CPU.

    .venv/bin/python bench/cpu_hybrid.py [--dtype float32] [--batch 1] [--kv-dtype bf16]
                                         [--threads 1]

Random weights at the real shapes (`artifact.synth.build_synthetic`, no file), the engine's own
pieces: `build_model`'s hybrid model, the paged KV pool and state slots (`build_memory`) and
`HybridRunner`. A 128-token prompt is prefilled in one chunk per sequence, then `--steps`
greedy decode steps over the whole batch. Writes bench/results/cpu-0.8b.{json,md}.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.report import cpu_machine, write_report  # noqa: E402
from ninfer_engine.artifact.synth import build_synthetic  # noqa: E402
from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.memory_plan import build_memory  # noqa: E402
from ninfer_engine.models import Qwen35Model  # noqa: E402
from ninfer_engine.step.family_runners import HybridRunner  # noqa: E402
from ninfer_engine.step.scheduler import Batch, Chunk  # noqa: E402

PROMPT_TOKENS = 128


def run(args: argparse.Namespace) -> dict:
    dtype = getattr(torch, args.dtype)
    start = time.perf_counter()
    config, params = build_synthetic("0.8b", "cpu", dtype, seed=0)
    model = Qwen35Model(config, params)
    load_s = time.perf_counter() - start
    engine_config = EngineConfig(artifact=Path("synthetic-0.8b"), kv_capacity=4096,
                                 max_concurrency=args.batch, kv_dtype=args.kv_dtype,
                                 no_prefix_reuse=True)
    memory = build_memory(engine_config, model)
    runner = HybridRunner(model)
    gen = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(args.batch):
        prompt = tuple(torch.randint(0, 1000, (PROMPT_TOKENS,), generator=gen).tolist())
        seq = SimpleNamespace(id=f"s{i}", prompt=prompt, prefix_key=prompt, output=[],
                              request=SimpleNamespace(max_tokens=args.steps + 1))
        assert memory.admit(seq)
        seqs.append(seq)
    with torch.inference_mode():
        start = time.perf_counter()
        for seq in seqs:
            logits = runner.forward(Batch([], [Chunk(seq, PROMPT_TOKENS)], [seq]))
            seq.output.append(int(logits[0].argmax()))
        prefill_s = time.perf_counter() - start
        step_times = []
        for _ in range(args.steps):
            for seq in seqs:
                assert memory.grow(seq, seq.cached + 1)
            start = time.perf_counter()
            logits = runner.forward(Batch(seqs, [], seqs))
            step_times.append(time.perf_counter() - start)
            for row, seq in enumerate(seqs):
                seq.output.append(int(logits[row].argmax()))
    measured = step_times[args.warmup:]
    decode_s = sum(measured)
    return {
        "dtype": args.dtype, "kv_dtype": args.kv_dtype, "batch": args.batch,
        "prompt_tokens": PROMPT_TOKENS, "decode_steps": len(measured), "warmup_steps": args.warmup,
        "weights_gib": model.weight_bytes() / 2**30, "build_s": load_s,
        "prefill_tok_s": args.batch * PROMPT_TOKENS / prefill_s,
        "decode_tok_s": args.batch * len(measured) / decode_s,
        "decode_step_ms_median": sorted(measured)[len(measured) // 2] * 1000,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--kv-dtype", default="bf16")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads; on a shared box OpenMP barriers stall extra threads")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu-0.8b")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    numbers = run(args)
    result = {
        "benchmark": "cpu-0.8b",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/cpu_hybrid.py " + " ".join(sys.argv[1:]),
        "machine": cpu_machine(load_average_1m=os.getloadavg()[0]),
        "model": "synthetic Qwen3.5-0.8B shape (24 layers, 18 GDN : 6 attention, random weights)",
        "ninfer": numbers,
    }
    write_report(args.out, result, markdown)
    return 0


def markdown(r: dict) -> str:
    m, n = r["machine"], r["ninfer"]
    return (
        f"# Synthetic Qwen3.5-0.8B on the CPU ({r['date'][:10]})\n\n"
        f"Machine: {m['cpu']}, {m['cores']} cores, shared with other jobs while measured (1-min "
        f"load average {m['load_average_1m']:.1f}), "
        f"torch {m['torch']} ({m['torch_threads']} threads). Command: `{r['command']}`. "
        f"Model: {r['model']}; weights {n['dtype']} ({n['weights_gib']:.2f} GiB), KV "
        f"`{n['kv_dtype']}`, batch {n['batch']}, {n['prompt_tokens']}-token prompt, "
        f"{n['decode_steps']} timed decode steps after {n['warmup_steps']} warm-up steps. "
        "Torch reference path (no Triton, no CUDA graphs), one forward per sequence.\n\n"
        "| prefill tok/s | decode tok/s | decode step (median) |\n|---:|---:|---:|\n"
        f"| {n['prefill_tok_s']:.1f} | {n['decode_tok_s']:.2f} | "
        f"{n['decode_step_ms_median']:.0f} ms |\n"
    )


if __name__ == "__main__":
    sys.exit(main())
