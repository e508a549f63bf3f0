"""Prompts that arrive together, stepped by the serving engine: each step's time, what it carried
and any Triton kernel compiled during it (served bursts of 8 1K-token prompts showed a first
token after 0.8-1.4 s where one such prompt alone takes 55 ms).

    python3 bench/prompt_burst.py [--arch 35b-a3b] [--layers 8] [--weights fp8-row]
        [--prompt 955] [--bursts 1,8,8,3,5,8] [--json PATH]

The engine is `ninfer bench`'s (`benchmark.engine_step.bench_engine`, random weights on the GPU,
with the start-up warm-up a served engine runs); each burst submits its prompts at once and
steps them to their first token (max_tokens 2). Triton's own hooks time every compile.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from triton import knobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.artifact.synth import build_synthetic  # noqa: E402
from ninfer_engine.benchmark.engine_step import bench_engine, random_prompts  # noqa: E402
from ninfer_engine.benchmark.footprint import packed_source  # noqa: E402
from ninfer_engine.models.experts import bf16_fits, free_device_bytes  # noqa: E402
from ninfer_engine.models.fused import FusedParams  # noqa: E402
from ninfer_engine.models.qwen3_5 import Qwen35Model  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402

COMPILES: list[dict] = []  # name, the argument signature, start and end (perf_counter)


def _start(**kw) -> bool:
    COMPILES.append({"name": kw["fn"].name, "repr": kw["repr"][-300:], "t0": time.perf_counter()})
    return False  # compile it


def _end(**kw) -> None:
    COMPILES[-1]["t1"] = time.perf_counter()


def burst(engine, prompts, tag: str) -> dict:
    seqs = []
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        req = GenerationRequest(f"{tag}-{i}", p, SamplingParams(temperature=0.0), max_tokens=2,
                                ignore_eos=True)
        seqs.append(engine.add(req, lambda e: None))
    steps, first = [], [None] * len(seqs)
    for _ in range(512):  # bounded
        before = sum(s.cached for s in seqs)
        a = time.perf_counter()
        busy = engine.step()
        torch.cuda.synchronize()
        b = time.perf_counter()
        steps.append({"ms": round((b - a) * 1e3, 2), "prompt_tokens": sum(s.cached for s in seqs)
                      - before, "compiles": [c["name"] for c in COMPILES
                                             if c["t0"] >= a and c.get("t1", b) <= b],
                      "compile_ms": round(sum(c.get("t1", b) - c["t0"] for c in COMPILES
                                              if c["t0"] >= a) * 1e3, 1)})
        for i, s in enumerate(seqs):
            if first[i] is None and s.output:
                first[i] = round((b - t0) * 1e3, 1)
        if not busy or all(s.finish_reason for s in seqs):
            break
    for _ in range(8):
        if not engine.step():
            break
    return {"burst": len(prompts), "first_token_ms": first, "steps": steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="35b-a3b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--weights", default="fp8-row")
    ap.add_argument("--prompt", type=int, default=955)
    ap.add_argument("--bursts", default="1,8,8,3,5,8")
    ap.add_argument("--json")
    args = ap.parse_args()
    knobs.runtime.jit_cache_hook = _start
    knobs.runtime.jit_post_compile_hook = _end
    with torch.inference_mode():
        config, source = build_synthetic(args.arch, "cuda", torch.bfloat16, args.layers)
        params = FusedParams(config, packed_source(source, args.weights, "auto",
                                                   bf16_fits(config, free_device_bytes("cuda"))))
        t = time.perf_counter()
        engine = bench_engine(Qwen35Model(config, params), args.arch, config, 8, 8192)
        print(f"engine built with warm-up in {time.perf_counter() - t:.1f} s, "
              f"{len(COMPILES)} compiles", flush=True)
        COMPILES.clear()
        results, seed = [], 1
        for n in map(int, args.bursts.split(",")):
            prompts = random_prompts(n, args.prompt, config["vocab_size"], seed=seed)
            seed += 1
            r = burst(engine, prompts, f"b{seed}")
            results.append(r)
            shown = " ".join(f"{s['ms']}({s['prompt_tokens']}t" + (
                f", C{s['compile_ms']})" if s["compiles"] else ")") for s in r["steps"])
            print(f"burst {n}: first tokens {r['first_token_ms']} ms; steps {shown}", flush=True)
        print("compiles after warm-up:")
        for c in COMPILES:
            print(f"  {c['name']} {(c.get('t1', c['t0']) - c['t0']) * 1e3:.0f} ms  {c['repr']}")
        engine.stop()
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "bursts": results,
                                               "compiles": COMPILES}, indent=1))


if __name__ == "__main__":
    main()
