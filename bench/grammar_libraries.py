"""llguidance against xgrammar on the same schema, tokenizer and token paths (issue 21: the
constrained-decoding library chosen by measurement).

    PYTHONPATH=<xgrammar installed here>:. python3 bench/grammar_libraries.py \
        --tokenizer-json .whl/qwen3_5-tokenizer.json --out bench/results/cpu-grammar-libraries.json

For each tokenizer (the default model's, and any `--tokenizer-json`), both libraries compile
one json_schema (nested objects, an enum, an array, bounded strings and integers; fixed ", " /
": " separators in both) and walk the same answers: valid JSON documents of the schema,
tokenized as the model would write them. At every token each fills the next-token bitmask of
one row (llguidance through the engine's own `bitmasks`, xgrammar's `fill_next_token_bitmask`),
then takes the token. Reported: compile time, and the per-token fill time (median, p99). Both
run on this machine's CPU with one matcher (the engine's rows are filled together by
llguidance's executor; xgrammar has its own batch matcher).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import llguidance

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.mask_cost import SCHEMA  # noqa: E402  (the same schema as the H200 mask cost)
from bench.report import cpu_machine, write_report  # noqa: E402
from ninfer_engine.constrained.grammar import JSON_STYLE, json_schema_grammar  # noqa: E402
from ninfer_engine.constrained.mask import bitmasks  # noqa: E402
from ninfer_engine.constrained.matcher import TokenConstraint  # noqa: E402

ANSWERS = [
    {"name": "Alice Martin", "age": 34, "favourite": "green",
     "address": {"city": "Lyon", "country": "France"}, "tags": ["reader", "cyclist"]},
    {"name": "Kenji Watanabe", "age": 61, "favourite": "blue",
     "address": {"city": "Osaka", "country": "Japan"}, "tags": []},
    {"name": "María José O'Neill", "age": 7, "favourite": "red",
     "address": {"city": "São Paulo", "country": "Brazil"}, "tags": ["kid", "chess", "piano"]},
    {"name": "Bob", "age": 150, "favourite": "green",
     "address": {"city": "New York City", "country": "United States"}, "tags": ["retired"]},
]


def load(json_text: str):
    """(HF tokenizers object, its JSON, vocab size, eos ids) of a tokenizer.json."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(json_text)
    data = json.loads(json_text)
    vocab = max([*data["model"]["vocab"].values(), *(t["id"] for t in data["added_tokens"])]) + 1
    eos = [t["id"] for t in data["added_tokens"]
           if t["content"] in ("<|im_end|>", "<|endoftext|>")]
    return backend, vocab, eos


def paths(backend) -> list[list[int]]:
    texts = [json.dumps(a, ensure_ascii=False) for a in ANSWERS]
    return [backend.encode(t, add_special_tokens=False).ids for t in texts]


def llguidance_run(json_text: str, vocab: int, eos: list[int], tokens: list[list[int]]) -> dict:
    started = time.perf_counter()
    view = llguidance.LLTokenizer(json_text, n_vocab=vocab, eos_token=eos)
    tokenizer_s = time.perf_counter() - started
    started = time.perf_counter()
    grammar = json_schema_grammar(SCHEMA)
    llguidance.LLMatcher(view, grammar, log_level=0)
    compile_s = time.perf_counter() - started
    times = []
    for path in tokens:
        constraint = TokenConstraint(llguidance.LLMatcher(view, grammar, log_level=0), vocab)
        for token in path:
            started = time.perf_counter()
            bits = bitmasks([constraint])
            times.append(time.perf_counter() - started)
            assert (int(bits[0, token // 32]) >> (token % 32)) & 1, "llguidance refused a token"
            constraint.advance(token)
    return {"tokenizer_s": tokenizer_s, "compile_s": compile_s, **_stats(times)}


def xgrammar_run(backend, vocab: int, eos: list[int], tokens: list[list[int]]) -> dict:
    import torch
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    started = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=backend),
                                              vocab_size=vocab, stop_token_ids=eos)
    compiler = xgr.GrammarCompiler(info, cache_enabled=False)
    tokenizer_s = time.perf_counter() - started
    started = time.perf_counter()
    compiled = compiler.compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False,
        separators=(JSON_STYLE["item_separator"], JSON_STYLE["key_separator"]))
    compile_s = time.perf_counter() - started
    bitmask = xgr.allocate_token_bitmask(1, vocab)
    times = []
    for path in tokens:
        matcher = xgr.GrammarMatcher(compiled)
        for token in path:
            started = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append(time.perf_counter() - started)
            assert (int(bitmask[0, token // 32]) >> (token % 32)) & 1, "xgrammar refused a token"
            assert matcher.accept_token(token)
    del torch
    return {"tokenizer_s": tokenizer_s, "compile_s": compile_s, **_stats(times)}


def _stats(times: list[float]) -> dict:
    ms = sorted(t * 1000 for t in times)
    return {"tokens": len(ms), "fill_ms_median": statistics.median(ms),
            "fill_ms_p99": ms[int(0.99 * (len(ms) - 1))], "fill_ms_mean": statistics.fmean(ms)}


def markdown(result: dict) -> str:
    lines = ["# Constrained decoding: llguidance against xgrammar", "",
             f"- machine: {result['machine']}", f"- command: `{result['command']}`",
             f"- versions: {result['versions']}", "",
             "| tokenizer | vocab | library | tokenizer view s | compile s | tokens | fill ms "
             "median | p99 | mean |", "|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        for lib in ("llguidance", "xgrammar"):
            r = row[lib]
            lines.append(f"| {row['tokenizer']} | {row['vocab']} | {lib} | {r['tokenizer_s']:.2f}"
                         f" | {r['compile_s'] * 1000:.1f} ms | {r['tokens']} | "
                         f"{r['fill_ms_median']:.3f} | {r['fill_ms_p99']:.3f} | "
                         f"{r['fill_ms_mean']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer-json", type=Path, nargs="*", default=[])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from ninfer_engine.artifact import open_artifact
    from ninfer_engine.cli.flags import default_artifact

    with open_artifact(default_artifact()) as artifact:
        sources = [("smollm2-135m", artifact.resource("tokenizer.json").decode())]
    sources += [(p.stem, p.read_text()) for p in args.tokenizer_json]
    rows = []
    for name, text in sources:
        backend, vocab, eos = load(text)
        tokens = paths(backend)
        rows.append({"tokenizer": name, "vocab": vocab,
                     "llguidance": llguidance_run(text, vocab, eos, tokens),
                     "xgrammar": xgrammar_run(backend, vocab, eos, tokens)})
    from importlib.metadata import version
    result = {"machine": cpu_machine(), "command": " ".join(sys.argv),
              "versions": {p: version(p) for p in ("llguidance", "xgrammar")}, "rows": rows}
    write_report(args.out, result, markdown)


if __name__ == "__main__":
    main()
