"""The engine's hybrid step on one GPU with the row kinds of issue 18: verify rows and mixed
steps, beside the pure-decode step they are measured against.

    python3 bench/gpu_step_rows.py [--out bench/results/h200-step-rows.json]
        [--shapes 27b:bf16,35b-a3b:fp8-row] [--batches 1,8] [--context 1024]

For each shape (`ninfer synth` config, random weights drawn on the GPU and stored as the recipe
says, served as `ninfer-serve --cuda-weights auto` would), B sequences hold `--context` tokens
of random KV and GDN state in the engine's paged pool and state-slot pool. Timed, each as the
engine runs it:
* `decode`: `DecodeGraphs.forward` (load + graph replay), one token a row;
* `verify k`: `DecodeGraphs.verify` (load + graph replay) of the last token and k drafts a row,
  k = 1..3, and its cost over the decode step (issue 18: ≤ 1.3× on 27B, ≤ 2.0× on 35B-A3B at
  B = 1, k = 3);
* `mixed`: `HybridRunner.forward` of a step with the B decode rows and one prompt chunk of
  `--chunk` tokens, against the decode step plus the chunk alone (issue 18: ≤ 1.15×).
"""
from __future__ import annotations

import argparse
import gc
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_report  # noqa: E402
from ninfer_engine.artifact.synth import build_synthetic  # noqa: E402
from ninfer_engine.benchmark.footprint import packed_source  # noqa: E402
from ninfer_engine.benchmark.timing import time_ms  # noqa: E402
from ninfer_engine.step.decode_graphs import DecodeGraphs  # noqa: E402
from ninfer_engine.models.qwen3_5_engine_step import EngineHybridDecoder  # noqa: E402
from ninfer_engine.kv import KvStorage, PagePool, codecs_for  # noqa: E402
from ninfer_engine.models.experts import bf16_fits, free_device_bytes  # noqa: E402
from ninfer_engine.models.fused import FusedParams  # noqa: E402
from ninfer_engine.models.qwen3_5 import Qwen35Model  # noqa: E402
from ninfer_engine.step.families import make_runner  # noqa: E402
from ninfer_engine.step.scheduler import Batch, Chunk  # noqa: E402

PAGE, STEPS, MAX_K = 64, 30, 3


def _model(arch, recipe):
    config, source = build_synthetic(arch, "cuda", torch.bfloat16)
    fits = bf16_fits(config, free_device_bytes("cuda"))
    params = FusedParams(config, packed_source(source, recipe, "auto", fits))
    return Qwen35Model(config, params)


def _sequences(storage, states, batch, context, room):
    seqs = []
    for b in range(batch):
        cache = storage.new_cache()
        assert cache.reserve(context + room)
        seq = SimpleNamespace(cache=cache, cached=context, output=[17 + b],
                              state=states.acquire(), prompt=[], request=None, rope_delta=0)
        for st in seq.state.layers:
            st.conv.normal_()
            st.ssm.normal_(std=0.1)
        seqs.append(seq)
    for layer in (*storage.k, *storage.v):
        layer[0].normal_()
    return seqs


def bench(arch, recipe, batches, context, chunk):
    model = _model(arch, recipe)
    layers, heads, dim = model.kv_layout()
    room = STEPS * (MAX_K + 2) + 2 * chunk + 64
    pages = (max(batches) + 1) * -(-(context + room) // PAGE) + 8
    storage = KvStorage(PagePool(pages, PAGE), layers, heads, dim,
                        codecs_for("bf16", model.dtype), model.dtype, "cuda")
    states = model.state_pool(max(batches) + 1)
    decoder = EngineHybridDecoder(model, storage, states, max(batches), context + room,
                                  max_q=1 + MAX_K)
    graphs = DecodeGraphs(decoder, capture=True)
    runner = make_runner(model, graphs)
    rows = []
    for batch in batches:
        seqs = _sequences(storage, states, batch, context, room)

        def rewind():
            for s in seqs:
                s.cached = context
        decode = time_ms(lambda: graphs.forward(seqs), STEPS)
        rewind()
        row = dict(batch=batch, context=context, decode_ms=decode, verify={})
        for k in range(1, MAX_K + 1):
            drafts = [[5 + t for t in range(k)] for _ in seqs]
            ms = time_ms(lambda: graphs.verify(seqs, drafts), STEPS)
            row["verify"][k] = dict(ms=ms, over_decode=ms / decode)
        # a step with B decode rows and one prompt chunk (a fresh sequence each call)
        prompt = SimpleNamespace(cache=storage.new_cache(), cached=0, output=[],
                                 state=states.acquire(), prompt=list(range(100, 100 + chunk)),
                                 request=SimpleNamespace(max_tokens=1))
        assert prompt.cache.reserve(chunk)

        def chunk_only():
            prompt.cached = 0
            return runner.forward(Batch([], [Chunk(prompt, chunk)], [prompt]))

        def mixed():
            prompt.cached = 0
            return runner.forward(Batch(seqs, [Chunk(prompt, chunk)], [*seqs, prompt]))
        alone = time_ms(chunk_only, 5)
        rewind()
        both = time_ms(mixed, 5)
        rewind()
        row["mixed"] = dict(chunk=chunk, chunk_ms=alone, mixed_ms=both,
                            over_separate=both / (decode + alone))
        print(f"{arch} {recipe} B={batch}: decode {decode:.2f} ms, verify "
              + ", ".join(f"k={k} {v['ms']:.2f} ({v['over_decode']:.2f}x)"
                          for k, v in row["verify"].items())
              + f"; chunk {chunk} {alone:.2f} ms, mixed {both:.2f} ms "
              f"({row['mixed']['over_separate']:.2f}x of separate)", file=sys.stderr, flush=True)
        rows.append(row)
        for s in (*seqs, prompt):
            s.cache.release()
            states.release(s.state)
    del runner, graphs, decoder, model, storage, states
    gc.collect()
    torch.cuda.empty_cache()
    return dict(shape=arch, recipe=recipe, rows=rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/h200-step-rows.json")
    ap.add_argument("--shapes", default="27b:bf16,35b-a3b:fp8-row")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=512)
    args = ap.parse_args()
    torch.manual_seed(0)
    results = []
    with torch.inference_mode():
        for item in args.shapes.split(","):
            arch, recipe = item.split(":")
            results.append(bench(arch, recipe, [int(b) for b in args.batches.split(",")],
                                 args.context, args.chunk))
    write_report(args.out, dict(
        machine=dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                     triton=triton.__version__, python=platform.python_version()),
        command="python3 bench/gpu_step_rows.py " + " ".join(sys.argv[1:]),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        weights="random, drawn on the GPU, stored as the recipe says", kv_dtype="bf16",
        results=results), markdown)


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = ["# The hybrid step's row kinds: verify rows and mixed steps", "",
             f"- machine: {m['device']}, torch {m['torch']}, Triton {m['triton']}, "
             f"Python {m['python']}",
             f"- command: `{result['command']}`, {result['date']}",
             f"- weights: {result['weights']}; KV {result['kv_dtype']}", "",
             "| shape | recipe | B | decode ms | verify k=1 | k=2 | k=3 | chunk | chunk alone ms "
             "| mixed ms | mixed / (decode + chunk) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["results"]:
        for row in r["rows"]:
            v = row["verify"]
            cells = [f"{v[k]['ms']:.2f} ({v[k]['over_decode']:.2f}×)"
                     for k in sorted(v, key=int)]
            mx = row["mixed"]
            lines.append(f"| {r['shape']} | {r['recipe']} | {row['batch']} | "
                         f"{row['decode_ms']:.2f} | " + " | ".join(cells)
                         + f" | {mx['chunk']} | {mx['chunk_ms']:.2f} | {mx['mixed_ms']:.2f} | "
                         f"{mx['over_separate']:.2f}× |")
    lines += ["", "verify k: one step of the last token and k drafts a row (graph replay, input "
              "loading included); (×) over the decode step. mixed: the B decode rows through "
              "the decode graph and the chunk through the eager batched forward, one step."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
