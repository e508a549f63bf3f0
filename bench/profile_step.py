"""Where one hybrid decode step (or a prefill) spends its GPU time: kernel totals, by name.

    python3 bench/profile_step.py --arch 35b-a3b [--batch 1] [--context 1024] [--layers N]
    python3 bench/profile_step.py --arch 35b-a3b --prefill 8192 [--layers N]
    python3 bench/profile_step.py --arch 27b --weights fp8-row [--cuda-weights auto|packed]

`--prefill N` profiles the engine's prefill path instead: `Qwen35Model.forward` over an N-token
prompt in 1024-token chunks (the default `--prefill-chunk`), from an empty state.

Builds the synthetic model on the GPU (random weights; `--weights` a recipe, served as
`ninfer bench` serves it: `benchmark.footprint.packed_source`), fills B sequences' state to the
context, times the step replayed from a CUDA graph, then profiles a few eager steps with
torch.profiler and prints the CUDA kernels by total time: the sum of kernel time against the
graph step time tells launch-bound from kernel-bound, and the table names the kernels to fuse.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.artifact.synth import build_synthetic  # noqa: E402
from ninfer_engine.benchmark.decode import KernelDecoder  # noqa: E402
from ninfer_engine.benchmark.timing import graph_of, time_ms  # noqa: E402
from ninfer_engine.benchmark.footprint import packed_source  # noqa: E402
from ninfer_engine.models.experts import bf16_fits, free_device_bytes  # noqa: E402
from ninfer_engine.models.fused import FusedParams  # noqa: E402
from ninfer_engine.models.qwen3_5 import Qwen35Model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="35b-a3b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--prefill", type=int, default=0, metavar="TOKENS")
    ap.add_argument("--weights", default="bf16", help="a `ninfer synth` recipe (fp8-row, …)")
    ap.add_argument("--cuda-weights", default="auto", choices=("auto", "packed"))
    args = ap.parse_args()
    with torch.inference_mode():
        config, source = build_synthetic(args.arch, "cuda", torch.bfloat16, args.layers)
        fits = bf16_fits(config, free_device_bytes("cuda"))
        params = FusedParams(config, packed_source(source, args.weights, args.cuda_weights, fits))
        model = Qwen35Model(config, params)
        if args.prefill:
            return profile_prefill(model, config, args.prefill)
        dec = KernelDecoder(model, params, args.context + 64, batch=args.batch)
        dec.fill_random(args.context, token=17)
        graph = graph_of(dec.greedy_step)
        step = time_ms(graph.replay, 30)
        eager = time_ms(dec.greedy_step, 3)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.steps):
                dec.greedy_step()
            torch.cuda.synchronize()
    events = prof.key_averages()
    kernel_ms = sum(e.device_time_total for e in events) / 1e3 / args.steps
    print(f"{args.arch} B={args.batch} ctx={args.context}: graph step {step:.2f} ms, eager "
          f"{eager:.2f} ms, kernel time per step {kernel_ms:.2f} ms")
    print(events.table(sort_by="device_time_total", row_limit=25, max_name_column_width=70))


def profile_prefill(model, config, tokens: int, chunk: int = 1024) -> None:
    ids = torch.randint(0, config["vocab_size"], (tokens,), device="cuda")

    def run():
        state = model.new_state()
        for i in range(0, tokens, chunk):
            model.forward(ids[i : i + chunk], state, last_only=True)

    run()  # warm-up: Triton compiles, cuBLAS picks its kernels
    ms = time_ms(run, 1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = prof.key_averages()
    kernel_ms = sum(e.device_time_total for e in events) / 1e3
    print(f"{config['num_hidden_layers']} layers, prefill {tokens}: {ms:.1f} ms "
          f"({tokens / ms * 1e3:.0f} tok/s), kernel time {kernel_ms:.1f} ms")
    print(events.table(sort_by="device_time_total", row_limit=25, max_name_column_width=70))


if __name__ == "__main__":
    main()
