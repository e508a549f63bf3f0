"""Aggregate decode throughput of the default model on this CPU at concurrency 1, 2, 4 and 8.

    .venv/bin/python bench/concurrency.py [--runs 3] [--output-tokens 64] [--threads 1]

Runs the engine in-process (no HTTP) with `--max-concurrency 8` and no prefix reuse, on eight
distinct ~110-token chat prompts (greedy; `ignore_eos` is asked and the tokens actually produced
are counted). Serial: the eight requests one after another. Level c: c requests submitted at
once. Decode tok/s counts the tokens after each request's first over the decode span (serial:
the spans summed; together: earliest first token to the last token, so other requests' prefill
chunks inside the span count against it); end-to-end tok/s counts every output token from
submission, prefill included. Ratios are to serial. Each run measures every level in turn (a
change in machine load hits all alike); medians over runs after a warm-up. Writes
bench/results/cpu-concurrency.{json,md} with the 1-minute load average (the machine is shared).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cpu_default_model import PROMPT  # noqa: E402
from bench.report import cpu_machine, write_report  # noqa: E402
from ninfer_engine.cli.flags import default_artifact  # noqa: E402

LEVELS = (1, 2, 4, 8)


async def _one(engine, prompt_ids: list[int], output_tokens: int) -> tuple[float, float, int]:
    """(first token time, last token time, tokens) of one request."""
    from ninfer_engine.types import GenerationRequest, SamplingParams

    request = GenerationRequest(request_id=f"bench-{time.monotonic_ns()}",
                                prompt_ids=tuple(prompt_ids), max_tokens=output_tokens,
                                sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    first = last = 0.0
    count = 0
    async for event in engine.submit(request):
        if event.error:
            raise RuntimeError(event.error.message)
        if event.token_ids:
            last = time.perf_counter()
            first = first or last
            count += len(event.token_ids)
    return first, last, count


def _rates(results: list[tuple[float, float, int]], submitted: float) -> tuple[float, float, int]:
    """(decode tok/s, end-to-end output tok/s, tokens) of requests that ran together.

    Decode counts the tokens after each request's first over the span from the earliest first
    token to the last token; end to end counts every output token from submission.
    """
    start = min(r[0] for r in results)
    end = max(r[1] for r in results)
    tokens = sum(r[2] for r in results)
    return sum(r[2] - 1 for r in results) / (end - start), tokens / (end - submitted), tokens


async def _together(engine, prompts: list[list[int]], output_tokens: int) -> tuple:
    submitted = time.perf_counter()
    results = await asyncio.gather(*(_one(engine, p, output_tokens) for p in prompts))
    return _rates(results, submitted)


async def _serial(engine, prompts: list[list[int]], output_tokens: int) -> tuple:
    """The same requests one after another: decode spans summed, and total wall time."""
    submitted = time.perf_counter()
    results = [await _one(engine, p, output_tokens) for p in prompts]
    decode = sum(r[2] - 1 for r in results) / sum(r[1] - r[0] for r in results)
    tokens = sum(r[2] for r in results)
    return decode, tokens / (time.perf_counter() - submitted), tokens


def _median(pairs: list[tuple], index: int) -> float:
    return statistics.median(p[index] for p in pairs)


def bench(artifact: Path, runs: int, output_tokens: int) -> dict:
    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine

    engine = Engine(EngineConfig(artifact=artifact, max_context=2048, max_concurrency=8,
                                 no_prefix_reuse=True))
    engine.start()
    prompts = [engine.tokenizer.encode(engine.chat_template.render(
        [{"role": "user", "content": f"Request {i + 1}. {PROMPT}"}])) for i in range(max(LEVELS))]
    try:
        asyncio.run(_together(engine, prompts[:2], 8))  # warm-up
        serial_runs: list[tuple] = []
        batched: dict[int, list[tuple]] = {c: [] for c in LEVELS}
        for _ in range(runs):
            serial_runs.append(asyncio.run(_serial(engine, prompts, output_tokens)))
            for c in LEVELS:
                batched[c].append(asyncio.run(_together(engine, prompts[:c], output_tokens)))
        serial = {"decode_tok_s": _median(serial_runs, 0),
                  "end_to_end_tok_s": _median(serial_runs, 1), "runs": serial_runs}
        levels = []
        for c in LEVELS:
            decode, end_to_end = _median(batched[c], 0), _median(batched[c], 1)
            levels.append({"concurrency": c, "aggregate_decode_tok_s": decode,
                           "aggregate_end_to_end_tok_s": end_to_end,
                           "ratio_to_serial_decode": decode / serial["decode_tok_s"],
                           "ratio_to_serial_end_to_end": end_to_end / serial["end_to_end_tok_s"],
                           "runs": batched[c]})
    finally:
        engine.stop()
    return {"prompt_tokens": [len(p) for p in prompts], "serial": serial, "levels": levels}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, default=default_artifact())
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu-concurrency")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    measured = bench(args.artifact, args.runs, args.output_tokens)
    result = {
        "benchmark": "cpu-concurrency",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python bench/concurrency.py", *sys.argv[1:]]),
        "machine": cpu_machine(
            load_average_1m={"before": load_before, "after": os.getloadavg()[0]}),
        "model": args.artifact.name,
        "output_tokens": args.output_tokens,
        "runs": args.runs,
        **measured,
    }
    write_report(args.out, result, markdown)
    return 0


def markdown(r: dict) -> str:
    m, serial = r["machine"], r["serial"]
    load = m["load_average_1m"]
    prompts = r["prompt_tokens"]
    lines = [
        f"# Default model: decode throughput by concurrency on the CPU ({r['date'][:10]})\n",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} "
        f"threads), 1-minute load average {load['before']:.2f} before and {load['after']:.2f} "
        f"after (the machine is shared with other work). Command: `{r['command']}`. "
        f"Model: {r['model']}; prompts of {min(prompts)}-{max(prompts)} tokens, "
        f"{r['output_tokens']} greedy output tokens per request, median of {r['runs']} runs. "
        f"Serial: the 8 requests one after another, {serial['decode_tok_s']:.1f} decode tok/s "
        f"({serial['end_to_end_tok_s']:.1f} output tok/s end to end, prefill included).\n",
        "| concurrency | aggregate decode tok/s | ratio to serial | end-to-end output tok/s "
        "| ratio to serial |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in r["levels"]:
        lines.append(f"| {row['concurrency']} | {row['aggregate_decode_tok_s']:.1f} | "
                     f"{row['ratio_to_serial_decode']:.2f} | "
                     f"{row['aggregate_end_to_end_tok_s']:.1f} | "
                     f"{row['ratio_to_serial_end_to_end']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
