"""Decode speed and time to first token of the default model on this machine's CPU.

    .venv/bin/python bench/cpu_default_model.py [--runs 5] [--peer]

Runs the engine in-process (no HTTP) once per `--cpu-matmul` (fp32, bf16, int8): a ~100-token
chat prompt, 128 greedy output tokens (EOS ignored so every run decodes the same count), median
over runs after one warm-up. With `--peer`
and `llama-cpp-python` importable, llama.cpp runs the same GGUF, prompt and token count in the
same process for the ratio. The CPU other processes used during each engine's runs is recorded
(`ForeignLoad`): another busy process on a 2-core box halves torch's 2-thread speed or worse. Writes
bench/results/cpu-default-model.{json,md}.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import ForeignLoad, cpu_machine, write_report  # noqa: E402
from ninfer_engine.cli.flags import default_artifact, ninfer_home  # noqa: E402

PROMPT = (
    "You are reviewing a short report about renewable energy. Summarise, in plain words, why "
    "solar panels produce less electricity in winter than in summer, mention the role of the "
    "angle of the sun, the length of the day and the weather, and finish with one practical "
    "tip for a family that wants to use more of its own solar power during the darker months "
    "of the year."
)
PUBLISHED_PEER = {"name": "llama.cpp (llama-cpp-python 0.3.36, 2 threads)", "decode_tok_s": 70.7,
                  "ttft_s": 0.47, "source": "perf-anchors.md §8, same machine type"}


async def run_ninfer(engine, prompt_ids: list[int], output_tokens: int) -> tuple[float, float]:
    from ninfer_engine.types import GenerationRequest, SamplingParams

    request = GenerationRequest(request_id=f"bench-{time.monotonic_ns()}",
                                prompt_ids=tuple(prompt_ids), max_tokens=output_tokens,
                                sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    start = time.perf_counter()
    first = last = None
    count = 0
    async for event in engine.submit(request):
        if event.token_ids:
            now = time.perf_counter()
            first = first or now
            last = now
            count += len(event.token_ids)
        if event.error:
            raise RuntimeError(event.error.message)
    assert count == output_tokens, f"generated {count} tokens, expected {output_tokens}"
    return first - start, (count - 1) / (last - first)


def bench_ninfer(artifact: Path, runs: int, output_tokens: int, cpu_matmul: str) -> dict:
    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine

    engine = Engine(EngineConfig(artifact=artifact, max_context=2048, cpu_matmul=cpu_matmul))
    engine.start()
    messages = [{"role": "user", "content": PROMPT}]
    prompt_ids = engine.tokenizer.encode(engine.chat_template.render(messages))
    try:
        asyncio.run(run_ninfer(engine, prompt_ids, 8))  # warm-up
        with ForeignLoad() as load:
            results = [asyncio.run(run_ninfer(engine, prompt_ids, output_tokens))
                       for _ in range(runs)]
    finally:
        engine.stop()
    return {"cpu_matmul": cpu_matmul, "prompt_tokens": len(prompt_ids),
            "foreign_load_cores": load.cores,
            "output_tokens": output_tokens,
            "ttft_s": statistics.median(r[0] for r in results),
            "decode_tok_s": statistics.median(r[1] for r in results),
            "runs": [{"ttft_s": t, "decode_tok_s": d} for t, d in results]}


def bench_llama_cpp(gguf: Path, prompt_ids: int, runs: int, output_tokens: int, threads: int):
    from llama_cpp import Llama

    llm = Llama(model_path=str(gguf), n_ctx=2048, n_threads=threads, verbose=False)
    messages = [{"role": "user", "content": PROMPT}]
    results = []
    for i in range(runs + 1):
        llm.reset()
        start = time.perf_counter()
        first = last = None
        count = 0
        for _ in llm.create_chat_completion(messages, max_tokens=output_tokens, temperature=0.0,
                                            stream=True):
            now = time.perf_counter()
            first = first or now
            last = now
            count += 1
        if i:  # the first run warms up
            results.append((first - start, (count - 2) / (last - first)))
    return {"ttft_s": statistics.median(r[0] for r in results),
            "decode_tok_s": statistics.median(r[1] for r in results),
            "name": "llama.cpp via llama-cpp-python, measured in this run"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, default=default_artifact())
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--peer", action="store_true", help="also run llama.cpp on the GGUF")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu-default-model")
    args = parser.parse_args()
    import torch

    ours = bench_ninfer(args.artifact, args.runs, args.output_tokens, "fp32")
    ours_bf16 = bench_ninfer(args.artifact, args.runs, args.output_tokens, "bf16")
    ours_int8 = bench_ninfer(args.artifact, args.runs, args.output_tokens, "int8")
    peer = dict(PUBLISHED_PEER)
    if args.peer:
        gguf = ninfer_home() / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf"
        with ForeignLoad() as load:
            peer = bench_llama_cpp(gguf, ours["prompt_tokens"], args.runs, args.output_tokens,
                                   torch.get_num_threads())
        peer["foreign_load_cores"] = load.cores
    result = {
        "benchmark": "cpu-default-model",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/cpu_default_model.py " + " ".join(sys.argv[1:]),
        "machine": cpu_machine(),
        "model": args.artifact.name,
        "ninfer": ours,
        "ninfer_bf16": ours_bf16,
        "ninfer_int8": ours_int8,
        "peer": peer,
        "ratio_decode": ours["decode_tok_s"] / peer["decode_tok_s"],
        "ratio_ttft": ours["ttft_s"] / peer["ttft_s"],
        "ratio_decode_bf16": ours_bf16["decode_tok_s"] / peer["decode_tok_s"],
        "ratio_ttft_bf16": ours_bf16["ttft_s"] / peer["ttft_s"],
        "ratio_decode_int8": ours_int8["decode_tok_s"] / peer["decode_tok_s"],
        "ratio_ttft_int8": ours_int8["ttft_s"] / peer["ttft_s"],
    }
    write_report(args.out, result, markdown)
    return 0


def _tok_s(e: dict) -> str:
    """Median decode tok/s and the range over the runs (this box's speed drifts by ±15 %)."""
    runs = [x["decode_tok_s"] for x in e["runs"]]
    return f"{e['decode_tok_s']:.1f} ({min(runs):.1f}-{max(runs):.1f})"


def markdown(r: dict) -> str:
    m, o, b, q, p = r["machine"], r["ninfer"], r["ninfer_bf16"], r["ninfer_int8"], r["peer"]
    loads = [e.get("foreign_load_cores") or 0.0 for e in (o, b, q, p)]
    return (
        f"# Default model on the CPU ({r['date'][:10]})\n\n"
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} "
        f"threads). Command: `{r['command']}`. Model: {r['model']}, {o['prompt_tokens']} prompt "
        f"tokens, {o['output_tokens']} greedy output tokens, median of {len(o['runs'])} runs.\n\n"
        "| engine | decode tok/s (runs' range) | time to first token |\n|---|---:|---:|\n"
        f"| ninfer (default, fp32) | {_tok_s(o)} | {o['ttft_s'] * 1000:.0f} ms |\n"
        f"| ninfer `--cpu-matmul bf16` | {_tok_s(b)} | {b['ttft_s'] * 1000:.0f} ms |\n"
        f"| ninfer `--cpu-matmul int8` | {_tok_s(q)} | {q['ttft_s'] * 1000:.0f} ms |\n"
        f"| {p['name']} | {p['decode_tok_s']:.1f} | {p['ttft_s'] * 1000:.0f} ms |\n"
        f"| ratio ninfer fp32 / peer | {r['ratio_decode']:.2f} | {r['ratio_ttft']:.2f} |\n"
        + "".join(f"| ratio ninfer {k} / peer | {r[f'ratio_decode_{k}']:.2f} | "
                  f"{r[f'ratio_ttft_{k}']:.2f} |\n" for k in ("bf16", "int8"))
        + f"\nCPU used by other processes during the runs (fp32, bf16, int8, peer): "
        + ", ".join(f"{x:.2f}" for x in loads) + " cores ("
        + ("quiet" if max(loads) < 0.25 else "another process was busy: those numbers are low")
        + ").\n"
    )


if __name__ == "__main__":
    sys.exit(main())
