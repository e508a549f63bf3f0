"""The grammar mask's cost per decode step (issue 21: < 5 % of a decode step at batch 8 on the
H200), on the engine's own sampler path.

    python3 bench/mask_cost.py --tokenizer-json .whl/qwen3_5-tokenizer.json --columns 248320 \
        --batches 1,8 --steps 300 --step-results bench/results/h200-ninfer-bench-35b-a3b-fp8.json \
        bench/results/h200-ninfer-bench-27b.json --out bench/results/h200-mask-cost.json

Each step times `sampling.sample_rows` of B rows (temperature 1, top_k 20: the model preset)
twice on the same logits: plain samplers, and samplers with a json_schema constraint each (a
nested object with enums, arrays and bounded strings; llguidance fills every row's mask in one
call, one host->device copy, unpacked and applied on the logits' device), both including the
step's one device->host copy of the tokens. Random logits (scaled ×3, bf16 on the device)
stand in for the model's; the grammars follow what is sampled, so the masks are the real ones,
and a row whose grammar finished starts a fresh one (not timed). The mask's cost is the
difference of the medians, compared with the step time that `ninfer bench` recorded at the
same B for the shapes given (an earlier run on the same machine kind; the mask runs on the
host after the forward was queued, so this isolated difference is an upper bound).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import llguidance
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import write_report  # noqa: E402
from ninfer_engine.constrained.grammar import json_schema_grammar  # noqa: E402
from ninfer_engine.constrained.matcher import TokenConstraint  # noqa: E402
from ninfer_engine.step.sampling import Sampler, sample_rows  # noqa: E402
from ninfer_engine.types import SamplingParams  # noqa: E402

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["name", "age", "favourite", "address", "tags"],
          "properties": {
              "name": {"type": "string", "maxLength": 40},
              "age": {"type": "integer", "minimum": 0, "maximum": 150},
              "favourite": {"enum": ["red", "green", "blue"]},
              "address": {"type": "object", "additionalProperties": False,
                          "required": ["city", "country"],
                          "properties": {"city": {"type": "string", "maxLength": 40},
                                         "country": {"type": "string", "maxLength": 40}}},
              "tags": {"type": "array", "maxItems": 3,
                       "items": {"type": "string", "maxLength": 20}}}}
PARAMS = SamplingParams(temperature=1.0, top_k=20)


def view(path: Path) -> tuple[llguidance.LLTokenizer, int]:
    text = path.read_text()
    data = json.loads(text)
    ids = [*data["model"]["vocab"].values(), *(t["id"] for t in data["added_tokens"])]
    eos = [t["id"] for t in data["added_tokens"] if t["content"] in ("<|im_end|>", "<|endoftext|>")]
    vocab = max(ids) + 1
    return llguidance.LLTokenizer(text, n_vocab=vocab, eos_token=eos), vocab


def run(tokenizer, vocab: int, columns: int, batch: int, steps: int, device: str) -> dict:
    grammar = json_schema_grammar(SCHEMA)

    def fresh() -> Sampler:
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        return Sampler(PARAMS, TokenConstraint(matcher, vocab))

    plain = [Sampler(PARAMS) for _ in range(batch)]
    masked = [fresh() for _ in range(batch)]
    gen = torch.Generator(device=device).manual_seed(0)
    times = {"plain": [], "masked": []}
    restarts = 0
    for step in range(steps + 10):  # the first 10 warm up
        logits = (torch.randn((batch, columns), generator=gen, device=device) * 3).bfloat16()
        for name, rows in (("plain", plain), ("masked", masked)):
            if device == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            sample_rows(logits, rows)
            if step >= 10:
                times[name].append((time.perf_counter() - started) * 1000)
        for i, sampler in enumerate(masked):
            if sampler.constraint.matcher.is_stopped() or sampler.constraint.matcher.is_accepting():
                masked[i] = fresh()
                restarts += 1
    plain_ms, masked_ms = (statistics.median(times[k]) for k in ("plain", "masked"))
    return {"batch": batch, "steps": steps, "plain_ms": plain_ms, "masked_ms": masked_ms,
            "mask_ms": masked_ms - plain_ms, "grammars_finished": restarts,
            "plain_p90_ms": sorted(times["plain"])[int(0.9 * steps)],
            "masked_p90_ms": sorted(times["masked"])[int(0.9 * steps)]}


def recorded_steps(paths: list[Path]) -> dict[str, dict[int, float]]:
    """{shape: {B: step ms}} from `ninfer bench` results (the concurrency rows)."""
    out = {}
    for path in paths:
        data = json.loads(path.read_text())
        out[path.stem] = {row["concurrency"]: row["step_ms"] for row in data["concurrency"]}
    return out


def markdown(result: dict) -> str:
    lines = [f"# Grammar mask cost per decode step ({result['device']})", "",
             f"- machine: {result['machine']}", f"- command: `{result['command']}`, "
             f"{result['date']}", f"- vocabulary: {result['vocab']} tokens, {result['columns']} "
             "logits a row; json_schema constraint on every row (see the script's SCHEMA)", "",
             "| B | sample_rows plain ms | with masks ms | mask ms | "
             + " | ".join(f"% of {s} step" for s in result["recorded"]) + " |",
             "|---|---|---|---|" + "---|" * len(result["recorded"])]
    for row in result["rows"]:
        shares = [f"{100 * row['mask_ms'] / steps[row['batch']]:.1f} % of {steps[row['batch']]:.2f} ms"
                  if row["batch"] in steps else "—" for steps in result["recorded"].values()]
        lines.append(f"| {row['batch']} | {row['plain_ms']:.3f} | {row['masked_ms']:.3f} | "
                     f"{row['mask_ms']:.3f} | " + " | ".join(shares) + " |")
    lines += ["", "Medians over the timed steps; the step times are those `ninfer bench` recorded "
              "(files named in the columns), not measured in this run."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer-json", type=Path, required=True)
    parser.add_argument("--columns", type=int, default=0, help="logits a row (default: vocab)")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--step-results", type=Path, nargs="*", default=[])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    tokenizer, vocab = view(args.tokenizer_json)
    columns = args.columns or vocab
    rows = [run(tokenizer, vocab, columns, int(b), args.steps, args.device)
            for b in args.batches.split(",")]
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    result = {"device": device, "machine": f"{device}, torch {torch.__version__}, llguidance "
              f"{llguidance.__version__ if hasattr(llguidance, '__version__') else '?'}, "
              f"Python {platform.python_version()}", "command": " ".join(sys.argv),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "vocab": vocab, "columns": columns, "rows": rows,
              "recorded": recorded_steps(args.step_results)}
    write_report(args.out, result, markdown)


if __name__ == "__main__":
    main()
