"""Host time of a 64-token turn over a long cached prefix, the model's forward stubbed out: what
the scheduler, the prefix tree and the step's bookkeeping cost per context length (the part of
a device hit's TTFT that no kernel explains). A tiny synthetic hybrid model on the CPU.

    .venv/bin/python bench/prefix_host_cost.py 2048 32768 131072

Prints, per context: the turn's host time to its first token and each step's.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from ninfer_engine.artifact.synth import build_synthetic  # noqa: E402
from ninfer_engine.benchmark.engine_step import (SyntheticResources, random_prompts,  # noqa: E402
                                                 run_requests)
from ninfer_engine.config import PAGE_TOKENS, EngineConfig  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.models.qwen3_5 import Qwen35Model  # noqa: E402

ARCH = "tiny-moe"


def stub_forward(vocab: int):
    """`forward_rows` that only advances the states' counters (no kernel, no K/V written)."""
    def forward_rows(self, token_ids, states, lengths, sampled=None, *args, **kwargs):
        for state, n in zip(states, lengths):
            state.seen += n
            for layer in state.layers:
                if hasattr(layer, "length"):
                    layer.length += n
        return torch.zeros(len(lengths if sampled is None else sampled), vocab)
    return forward_rows


def main() -> int:
    torch.set_num_threads(1)
    config, params = build_synthetic(ARCH, "cpu", torch.float32)
    model = Qwen35Model(config, params)
    vocab = config["vocab_size"]
    Qwen35Model.forward_rows = stub_forward(vocab)
    for context in map(int, sys.argv[1:] or ["2048", "32768"]):
        pool = -(-(context + 6 * PAGE_TOKENS) // PAGE_TOKENS) * PAGE_TOKENS
        engine = Engine(EngineConfig(artifact=Path("synth"), max_concurrency=1,
                                     max_context=pool, kv_capacity=pool, prefill_chunk=4096),
                        SyntheticResources(ARCH, config), model=model)
        prompt = random_prompts(1, context, vocab, seed=1)[0]
        a, b = random_prompts(2, 64, vocab, seed=2)
        run_requests(engine, [prompt], 1)
        run_requests(engine, [prompt + a], 1)
        run = run_requests(engine, [prompt + a + b], 1)
        steps = ", ".join(f"{s * 1e3:.1f}" for s in run.step_s)
        print(f"context {context}: first token after {run.first_token_s[0] * 1e3:.1f} ms of host "
              f"work (steps {steps} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
