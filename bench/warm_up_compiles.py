"""Which Triton variants compile after the start-up warm-up, and how they differ from the
warm-up's: the tiny-moe engine on CUDA (as `tests/engine/test_warm_up.py` builds it), then one
long greedy request (a 9,000-token prompt in 2,048-token chunks) and a burst of eight 300-token
prompts; each compile after the warm-up is printed with its specialization (argument types,
alignment and divisibility) beside that kernel's warm-up variants, and the engine line that
launched it.

    python3 bench/warm_up_compiles.py
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch
from triton import knobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ninfer_engine.artifact.synth import build_synthetic  # noqa: E402
from ninfer_engine.benchmark import engine_step  # noqa: E402
from ninfer_engine.models.fused import FusedParams  # noqa: E402
from ninfer_engine.models.qwen3_5 import Qwen35Model  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402

seen: list[tuple[str, str, str]] = []  # (kernel, specialization, launching engine line)


def _hook(**kw):
    frames = [f for f in traceback.extract_stack() if "ninfer_engine/" in f.filename]
    where = "?"
    if frames:
        where = f"{frames[-1].filename.split('ninfer_engine/')[1]}:{frames[-1].lineno}"
    c = kw.get("compile") or {}  # Triton 3.6: the argument types, constants, attributes
    spec = f"{c.get('signature')} constants {c.get('constants')} attrs {c.get('configs')}"
    seen.append((kw["fn"].name, spec, where))
    return False


def _run(engine, requests, steps: int) -> None:
    seqs = [engine.add(r, lambda event: None) for r in requests]
    for _ in range(steps):  # bounded
        if not engine.step() or all(s.finish_reason for s in seqs):
            break


def main() -> None:
    knobs.runtime.jit_cache_hook = _hook
    with torch.inference_mode():
        config, source = build_synthetic("tiny-moe", "cuda", torch.bfloat16, 4)
        model = Qwen35Model(config, FusedParams(config, source))
        engine = engine_step.bench_engine(model, "tiny-moe", config, 8, 10240,
                                          prefill_chunk=2048)
        warm = len(seen)
        greedy = SamplingParams(temperature=0.0)
        vocab = config["vocab_size"]
        _run(engine, [GenerationRequest("long", engine_step.random_prompts(1, 9000, vocab,
                                                                           seed=3)[0],
                                        greedy, max_tokens=4, ignore_eos=True)], 16)
        _run(engine, [GenerationRequest(f"b{i}", p, greedy, max_tokens=2, ignore_eos=True)
                      for i, p in enumerate(engine_step.random_prompts(8, 300, vocab, seed=8))],
             16)
        engine.stop()
    print(f"{warm} compiles in the build and warm-up, {len(seen) - warm} after")
    for name, spec, where in seen[warm:]:
        print(f"AFTER {name} from {where}\n  {spec}")
        for n, s, w in seen[:warm]:
            if n == name:
                print(f"  warm-up's, from {w}: {s}")


if __name__ == "__main__":
    main()
