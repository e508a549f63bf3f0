"""`--spec ngram` on the default model's CPU engine, beside `--spec` off in the same run.

    .venv/bin/python bench/cpu_spec_ngram.py [--runs 3] [--draft-tokens 3]

Prompts whose answers repeat their context (a code edit, a JSON rewrite, a text to copy with
one change), greedy, up to 160 tokens each, in-process (no HTTP). For each prompt and setting:
decode tok/s (output tokens after the first / time from the first to the last), median over
runs after one warm-up; for ngram also acceptance (accepted / drafted drafts) and tokens per
round. The greedy outputs of both settings must be identical (the script fails otherwise).
Writes bench/results/cpu-spec-ngram.{json,md}.
"""
from __future__ import annotations

import argparse
import os
import asyncio
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import (ForeignLoad, cpu_machine, speculation_counts,  # noqa: E402
                          write_report)
from ninfer_engine.cli.flags import default_artifact  # noqa: E402
from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402

CODE = '''def total_price(items, tax):
    total = 0
    for item in items:
        price = item["price"] * item["quantity"]
        if item.get("discount"):
            price = price - price * item["discount"]
        total = total + price
    return total + total * tax'''
PROMPTS = {
    "code edit": f"Rename the variable `total` to `subtotal` in this Python function and "
                 f"return the whole function, nothing else:\n\n{CODE}",
    "json rewrite": 'Return this JSON object with "status" changed to "shipped", nothing '
                    'else:\n{"order": 1042, "customer": "Ada Lovelace", "items": ["lamp", '
                    '"desk", "chair"], "status": "packed", "address": "12 Analytical Way, '
                    'London"}',
    "copy with a change": "Copy this sentence, replacing 'cats' with 'dogs': The cats sat by "
                          "the window all afternoon, watching the birds in the garden and "
                          "waiting for the rain to stop.",
}


async def _generate(engine, prompt_ids):
    request = GenerationRequest(f"b{time.monotonic_ns()}", tuple(prompt_ids),
                                SamplingParams(temperature=0.0), max_tokens=160)
    times, tokens = [], []
    async for event in engine.submit(request):
        if event.token_ids:
            times.append(time.perf_counter())
            tokens += event.token_ids
    return tokens, times


def run(spec: str | None, k: int, runs: int) -> dict:
    engine = Engine(EngineConfig(artifact=default_artifact(dict(os.environ)), max_context=2048,
                                 spec=spec, draft_tokens=k if spec else None))
    engine.start()
    out = {}
    try:
        for name, text in PROMPTS.items():
            ids = engine.tokenizer.encode(engine.chat_template.render(
                [{"role": "user", "content": text}]))
            asyncio.run(_generate(engine, ids))  # warm-up
            before = engine.speculator.stats() if spec else None
            rates, tokens = [], None
            with ForeignLoad() as load:
                for _ in range(runs):
                    tokens, times = asyncio.run(_generate(engine, ids))
                    rates.append((len(tokens) - 1) / (times[-1] - times[0]))
            row = {"prompt_tokens": len(ids), "output_tokens": len(tokens), "tokens": tokens,
                   "decode_tok_s": statistics.median(rates), "runs": rates,
                   "foreign_load_cores": load.cores}
            if spec:
                row.update(speculation_counts(before, engine.speculator.stats()))
            out[name] = row
    finally:
        engine.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--draft-tokens", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/cpu-spec-ngram.json")
    args = ap.parse_args()
    off = run(None, 0, args.runs)
    on = run("ngram", args.draft_tokens, args.runs)
    for name in PROMPTS:
        if off[name]["tokens"] != on[name]["tokens"]:
            print(f"{name}: greedy outputs differ with --spec ngram", file=sys.stderr)
            return 1
    result = {"machine": cpu_machine(), "date": datetime.now(timezone.utc).isoformat(
              timespec="seconds"), "command": "bench/cpu_spec_ngram.py " + " ".join(sys.argv[1:]),
              "model": str(default_artifact(dict(os.environ))), "draft_tokens": args.draft_tokens,
              "off": off, "ngram": on,
              "speedup": {n: on[n]["decode_tok_s"] / off[n]["decode_tok_s"] for n in PROMPTS}}
    write_report(args.out, result, markdown)
    return 0


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = ["# `--spec ngram` on the default model (CPU), beside `--spec` off", "",
             f"- machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} "
             f"({m['torch_threads']} threads), Python {m['python']}",
             f"- command: `{r['command']}`, {r['date']}; model `{r['model']}`; greedy, "
             f"{r['draft_tokens']} draft tokens; outputs identical in both settings", "",
             "| prompt | output tokens | off tok/s | ngram tok/s | speed-up | acceptance "
             "| tokens / round | other processes (cores) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, on in r["ngram"].items():
        off = r["off"][name]
        lines.append(f"| {name} | {on['output_tokens']} | {off['decode_tok_s']:.1f} | "
                     f"{on['decode_tok_s']:.1f} | {r['speedup'][name]:.2f}× | "
                     f"{100 * on['acceptance']:.0f} % | {on['tokens_per_round']:.2f} | "
                     f"{off['foreign_load_cores']:.2f} / {on['foreign_load_cores']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
