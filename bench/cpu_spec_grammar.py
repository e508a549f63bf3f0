"""`--spec ngram` on constrained rows (json_schema, issue 21) on the default model's CPU engine.

    .venv/bin/python bench/cpu_spec_grammar.py [--runs 3] [--draft-tokens 3] [--before OLD.json]

JSON rewrite prompts (the answer repeats the prompt's object with one change), greedy, up to
160 tokens, in-process (no HTTP), each unconstrained and under a json_schema grammar of the
object, with `--spec` off, `--spec ngram` (the engine's own speculation policy deciding per
step, as served) and `--spec ngram` drafting every step it can (`AlwaysSpeculate`: what a verify
round costs and brings here, whatever the policy would choose). For each: decode tok/s
(output tokens after the first / time from the first to the last), median over runs after one
warm-up, the three settings' runs interleaved; with ngram, acceptance (accepted / drafted) and
tokens per round. Greedy outputs must not depend on `--spec` (the script fails otherwise).
`--before` an earlier run's JSON puts its table beside this one. Writes
bench/results/cpu-spec-grammar.{json,md}.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
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
from ninfer_engine.constrained import compile_constraint, json_schema_grammar  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.step.spec_policy import AlwaysSpeculate  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402

STRING, INTEGER = {"type": "string"}, {"type": "integer"}
PROMPTS = {
    "order": ('Return this JSON object with "status" changed to "shipped", nothing else:\n'
              '{"order": 1042, "customer": "Ada Lovelace", "items": ["lamp", "desk", "chair"], '
              '"status": "packed", "address": "12 Analytical Way, London"}',
              {"type": "object", "required": ["order", "customer", "items", "status", "address"],
               "properties": {"order": INTEGER, "customer": STRING, "status": STRING,
                              "items": {"type": "array", "items": STRING},
                              "address": STRING}}),
    "product": ('Return this JSON object with "price" changed to 24.5, nothing else:\n'
                '{"sku": "LMP-204", "name": "Brass desk lamp", "price": 19.99, "in_stock": true, '
                '"tags": ["lighting", "office", "brass"], "supplier": "Northwind Traders"}',
                {"type": "object",
                 "required": ["sku", "name", "price", "in_stock", "tags", "supplier"],
                 "properties": {"sku": STRING, "name": STRING, "price": {"type": "number"},
                                "in_stock": {"type": "boolean"},
                                "tags": {"type": "array", "items": STRING},
                                "supplier": STRING}}),
}


async def _generate(engine, prompt_ids, grammar):
    constraint = compile_constraint(engine.tokenizer, grammar) if grammar else None
    request = GenerationRequest(f"b{time.monotonic_ns()}", tuple(prompt_ids),
                                SamplingParams(temperature=0.0), max_tokens=160,
                                constraint=constraint)
    times, tokens = [], []
    async for event in engine.submit(request):
        if event.token_ids:
            times.append(time.perf_counter())
            tokens += event.token_ids
    return tokens, times


# setting -> (--spec, draft every step the drafter proposes)
SETTINGS = {"off": (None, False), "ngram": ("ngram", False), "ngram_always": ("ngram", True)}


def _engine(spec: str | None, k: int, always: bool) -> Engine:
    engine = Engine(EngineConfig(artifact=default_artifact(dict(os.environ)), max_context=2048,
                                 spec=spec, draft_tokens=k if spec else None))
    if always:
        engine.speculator.policy = AlwaysSpeculate()
    engine.start()
    return engine


def run(k: int, runs: int) -> dict[str, dict]:
    """{setting: {prompt / output: row}}: the three settings' engines side by side, their runs
    interleaved (run i of each before run i + 1 of any), so the box's drifting load falls on
    all three alike."""
    engines: dict[str, Engine] = {}
    out: dict[str, dict] = {name: {} for name in SETTINGS}
    try:
        for name, (spec, always) in SETTINGS.items():
            engines[name] = _engine(spec, k, always)
        tokenizer, template = engines["off"].tokenizer, engines["off"].chat_template
        for prompt, (text, schema) in PROMPTS.items():
            ids = tokenizer.encode(template.render([{"role": "user", "content": text}]))
            for mode, grammar in (("free", None), ("json_schema", json_schema_grammar(schema))):
                for engine in engines.values():
                    asyncio.run(_generate(engine, ids, grammar))  # warm-up
                before = {n: e.speculator.stats() for n, e in engines.items() if e.speculator}
                rates: dict[str, list[float]] = {n: [] for n in engines}
                tokens: dict[str, list[int]] = {}
                with ForeignLoad() as load:
                    for _ in range(runs):
                        for n, engine in engines.items():
                            tokens[n], times = asyncio.run(_generate(engine, ids, grammar))
                            rates[n].append((len(tokens[n]) - 1) / (times[-1] - times[0]))
                for n, engine in engines.items():
                    row = {"output_tokens": len(tokens[n]), "tokens": tokens[n],
                           "text": tokenizer.decode(tokens[n]),
                           "decode_tok_s": statistics.median(rates[n]), "runs": rates[n],
                           "foreign_load_cores": load.cores}
                    if n in before:
                        row.update(speculation_counts(before[n], engine.speculator.stats()))
                    out[n][f"{prompt} / {mode}"] = row
    finally:
        for engine in engines.values():
            engine.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--draft-tokens", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/cpu-spec-grammar.json")
    ap.add_argument("--before", type=Path,
                    help="an earlier run's JSON (another commit's), shown beside this one")
    args = ap.parse_args()
    before = json.loads(args.before.read_text()) if args.before else None
    r = run(args.draft_tokens, args.runs)
    off, on, always = r["off"], r["ngram"], r["ngram_always"]
    for name in off:
        if not off[name]["tokens"] == on[name]["tokens"] == always[name]["tokens"]:
            print(f"{name}: greedy outputs differ with --spec ngram", file=sys.stderr)
            return 1
    result = {"machine": cpu_machine(), "date": datetime.now(timezone.utc).isoformat(
              timespec="seconds"), "command": "bench/cpu_spec_grammar.py " + " ".join(sys.argv[1:]),
              "commit": _commit(), "model": str(default_artifact(dict(os.environ))),
              "draft_tokens": args.draft_tokens, "runs": args.runs, **r,
              "speedup": {n: on[n]["decode_tok_s"] / off[n]["decode_tok_s"] for n in off},
              "speedup_always": {n: always[n]["decode_tok_s"] / off[n]["decode_tok_s"]
                                 for n in off}}
    if before is not None:
        result["before"] = {key: before[key] for key in (
            "date", "command", "commit", "off", "ngram", "ngram_always", "speedup",
            "speedup_always") if key in before}
    write_report(args.out, result, markdown)
    return 0


def _commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() or None


def _table(r: dict) -> list[str]:
    lines = ["| prompt / output | output tokens | off tok/s | policy tok/s (rounds) "
             "| policy speed-up | always tok/s | always speed-up | acceptance (always) "
             "| tokens / round (always) | other processes (cores) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, on in r["ngram"].items():
        off, always = r["off"][name], r["ngram_always"][name]
        load = on["foreign_load_cores"]
        lines.append(f"| {name} | {on['output_tokens']} | {off['decode_tok_s']:.1f} | "
                     f"{on['decode_tok_s']:.1f} ({on['rounds']}) | {r['speedup'][name]:.2f}× | "
                     f"{always['decode_tok_s']:.1f} | {r['speedup_always'][name]:.2f}× | "
                     f"{100 * always['acceptance']:.0f} % | {always['tokens_per_round']:.2f} | "
                     f"{'—' if load is None else f'{load:.2f}'} |")
    return lines


def markdown(r: dict) -> str:
    m = r["machine"]
    lines = ["# `--spec ngram` on json_schema rows (CPU), beside unconstrained and `--spec` off",
             "", f"- machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} "
             f"({m['torch_threads']} threads), Python {m['python']}",
             f"- command: `{r['command']}`, {r['date']}, commit {r.get('commit')}; model "
             f"`{r['model']}`; greedy, {r['draft_tokens']} draft tokens; outputs identical in "
             "all three settings",
             f"- tok/s: medians over {r['runs']} runs after a warm-up, the three settings' "
             "engines loaded side by side and their runs interleaved (compare within a row: "
             "a lone engine runs faster). The box is shared and noisy (2 cores; the last "
             "column is other processes' load during the runs)",
             "- policy: the engine's speculation policy (`spec_policy`, as served); always: "
             "every step drafts where prompt lookup proposes (`AlwaysSpeculate`). Rounds: "
             "verify rounds over the warm-up and the runs",
             "- reading: a verify step runs in the compiled CPU step (`models/llama_cpu_step.py`"
             ": a row's token and its drafts are consecutive rows of the C step, which read "
             "each weight once for all of them), well under 1 + k decode steps' cost, so the "
             "policy drafts wherever prompt lookup proposes and acceptance is high", "",
             *_table(r)]
    b = r.get("before")
    if b:
        lines += ["", f"## Before: commit {b.get('commit', '?')}, {b['date']} "
                  f"(`{b['command']}`, settings run one after another)", "",
                  "Verify steps ran the eager forward (~7× a compiled decode step), so each "
                  "policy probe lost time and drafting every step halved the speed.", "",
                  *_table(b)]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
