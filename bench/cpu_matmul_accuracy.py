"""How closely `--cpu-matmul bf16|int8` decode tracks the exact fp32 path on the default model.

    .venv/bin/python bench/cpu_matmul_accuracy.py [--tokens 64]

For each chat prompt the fp32 model decodes `--tokens` greedy tokens (EOS ignored). Each
narrowed model then (a) decodes greedily on its own: the first position where its text leaves
fp32's, and (b) is teacher-forced along fp32's tokens one decode step at a time (the path the
narrowed weights serve): the share of steps whose argmax is fp32's token, and the mean relative
L2 error of its logits. Writes bench/results/cpu-matmul-accuracy.{json,md}.
"""
from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import cpu_machine, write_report  # noqa: E402
from ninfer_engine.cli.flags import default_artifact  # noqa: E402

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "How do I reverse a list in Python?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
]


def _steps(model, prompt: list[int], feed: list[int] | None, tokens: int):
    """(greedy tokens, per-step logits): feeds `feed` when given (teacher forcing), else its own
    argmax. The prompt is one prefill forward; every later token is one decode forward."""
    from ninfer_engine.models import Segment

    cache = model.new_cache()
    n = len(prompt)
    logits = model.forward(torch.tensor(prompt), torch.arange(n), [Segment(cache, 0, n)],
                           torch.tensor([n - 1]))[0]
    out, rows = [], []
    for i in range(tokens):
        rows.append(logits)
        out.append(int(logits.argmax()))
        nxt = feed[i] if feed is not None else out[-1]
        logits = model.forward(torch.tensor([nxt]), torch.tensor([n + i]),
                               [Segment(cache, n + i, 1)], torch.tensor([0]))[0]
    return out, rows


def measure(artifact_path: Path, tokens: int, kinds: list[str]) -> dict:
    from ninfer_engine.artifact import open_artifact
    from ninfer_engine.chat import ChatTemplate
    from ninfer_engine.serving import MATMUL_DTYPES
    from ninfer_engine.models import build_model
    from ninfer_engine.tokenizer import Tokenizer

    artifact = open_artifact(artifact_path)
    tok = Tokenizer.from_artifact(artifact)
    template = ChatTemplate.from_artifact(artifact, None, tok.bos_token, tok.eos_token)
    text = artifact.config("text")
    models = {k: build_model(text, artifact, "cpu", torch.float32, MATMUL_DTYPES[k])
              for k in ["fp32", *kinds]}
    prompts = [tok.encode(template.render([{"role": "user", "content": p}])) for p in PROMPTS]
    result = {k: {"prompts": []} for k in kinds}
    with torch.inference_mode():
        for text_prompt, ids in zip(PROMPTS, prompts):
            ref, ref_rows = _steps(models["fp32"], ids, None, tokens)
            for k in kinds:
                own, _ = _steps(models[k], ids, None, tokens)
                forced, rows = _steps(models[k], ids, ref, tokens)
                diverge = next((i for i, (a, b) in enumerate(zip(own, ref)) if a != b), tokens)
                err = [float((r - e).norm() / e.norm()) for r, e in zip(rows, ref_rows)]
                result[k]["prompts"].append({
                    "prompt": text_prompt, "identical_prefix": diverge,
                    "forced_agreement": sum(a == b for a, b in zip(forced, ref)) / tokens,
                    "mean_rel_l2_logits": sum(err) / len(err)})
    for k in kinds:
        rows = result[k]["prompts"]
        result[k]["forced_agreement"] = sum(r["forced_agreement"] for r in rows) / len(rows)
        result[k]["identical_prefix_mean"] = sum(r["identical_prefix"] for r in rows) / len(rows)
        result[k]["mean_rel_l2_logits"] = sum(r["mean_rel_l2_logits"] for r in rows) / len(rows)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, default=default_artifact())
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "cpu-matmul-accuracy")
    args = parser.parse_args()
    result = {"benchmark": "cpu-matmul-accuracy",
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "command": "python bench/cpu_matmul_accuracy.py " + " ".join(sys.argv[1:]),
              "machine": cpu_machine(), "model": args.artifact.name, "tokens": args.tokens,
              "results": measure(args.artifact, args.tokens, ["bf16", "int8"])}
    write_report(args.out, result, markdown)
    return 0


def markdown(r: dict) -> str:
    lines = [f"# `--cpu-matmul` against fp32 on the default model ({r['date'][:10]})\n",
             f"Command: `{r['command']}`. Model: {r['model']}, {len(PROMPTS)} chat prompts, "
             f"{r['tokens']} greedy tokens each (EOS ignored). *Identical prefix*: tokens before "
             "its own greedy text first differs from fp32's. *Teacher-forced agreement*: share "
             "of decode steps, fed fp32's tokens, whose argmax is fp32's. *Logit error*: "
             "‖Δlogits‖₂ / ‖logits‖₂ per step, mean. The fp32 reference is the artifact's "
             "weights dequantized (the default model stores q8_g32: Q8_0 groups of 32), so int8 "
             "measures what requantizing them with one scale per output row adds, plus bf16 "
             "activations as in bf16.\n",
             "| `--cpu-matmul` | teacher-forced agreement | identical prefix (mean) "
             "| logit error |", "|---|---:|---:|---:|"]
    for k, v in r["results"].items():
        lines.append(f"| {k} | {100 * v['forced_agreement']:.1f} % | "
                     f"{v['identical_prefix_mean']:.1f} / {r['tokens']} | "
                     f"{100 * v['mean_rel_l2_logits']:.2f} % |")
    lines += ["", "Per prompt (identical prefix, teacher-forced agreement):", ""]
    for k, v in r["results"].items():
        cells = ", ".join(f"{p['identical_prefix']} / {100 * p['forced_agreement']:.0f} %"
                          for p in v["prompts"])
        lines.append(f"- {k}: {cells}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
