"""Prompts that arrive together, stepped by the serving engine: each step's time, what it carried
and any Triton kernel compiled during it.

    python3 bench/prompt_burst.py [--arch 35b-a3b] [--layers 8] [--weights fp8-row]
        [--bursts 1x120,8x120,8x120,1x955,8x955,8x955,3x955] [--served] [--prefix-reuse]
        [--profile 8x120[,1x120]] [--trace 8x955,1x955 --trace-dir D [--trace-light]]
        [--syncs 8x120] [--prefill-activations fp8|bf16] [--gdn-walk chunk|split]
        [--gdn-tiles fp32|bf16] [--json PATH]

Why (H200, 8-layer 35B-A3B shape, tree a50778c): served at concurrency 8, eight streams of equal
length finish together and eight 120-token prompts arrive together each round; their first
token took ~130 ms (50 ms at concurrency 1), which is most of the gap between the served
aggregate and the engine's own step (0.68). Eight 1K-token prompts at once waited 0.8-1.4 s, one
alone 55-72 ms. This separates the candidates: a Triton compile in traffic (timed through
Triton's own hooks), the prefix cache's work at each prompt's end (`--prefix-reuse`), the
served sampling (`--served`: the preset's penalties), and the eager prompt step's host time
(`--profile NxL`: that burst again under torch.profiler, kernel time against wall time, and
cProfile's top host functions; `--syncs NxL`: where the host waits for the device, by line).

The engine is `ninfer bench`'s (`benchmark.engine_step.bench_engine`, random weights on the
GPU, with the start-up warm-up a served engine runs); each burst submits its prompts at once
and steps them to their first token (max_tokens 2).
"""
from __future__ import annotations

import argparse
import cProfile
import dataclasses
import gzip
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function
from triton import knobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.artifact.synth import build_synthetic  # noqa: E402
from ninfer_engine.benchmark.engine_step import bench_engine, random_prompts  # noqa: E402
from ninfer_engine.benchmark.footprint import packed_source  # noqa: E402
from ninfer_engine.kernels.compile_watch import variant  # noqa: E402
from ninfer_engine.models import gdn  # noqa: E402
from ninfer_engine.models.experts import bf16_fits, free_device_bytes  # noqa: E402
from ninfer_engine.models.fused import FusedParams  # noqa: E402
from ninfer_engine.models.packed import FP8_ACTIVATIONS_KEY  # noqa: E402
from ninfer_engine.models.qwen3_5 import Qwen35Model  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402

COMPILES: list[dict] = []  # name, specialisation, start and end (perf_counter)
STEP_RANGE = "burst step "  # the profiler range of each of a burst's steps


def _start(**kw) -> bool:
    COMPILES.append({"name": kw["fn"].name, "variant": variant(kw), "t0": time.perf_counter()})
    return False  # compile it


def _end(**kw) -> None:
    COMPILES[-1]["t1"] = time.perf_counter()


def burst(engine, prompts, sampling: SamplingParams, tag: str) -> dict:
    seqs = [engine.add(GenerationRequest(f"{tag}-{i}", p, sampling, max_tokens=2,
                                         ignore_eos=True), lambda e: None)
            for i, p in enumerate(prompts)]
    t0 = time.perf_counter()
    steps, first = [], [None] * len(seqs)
    for k in range(512):  # bounded
        before = sum(s.cached for s in seqs)
        a = time.perf_counter()
        with record_function(f"{STEP_RANGE}{k}"):  # `gpu_timeline`'s windows under a profiler
            busy = engine.step()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        b = time.perf_counter()
        during = [c for c in COMPILES if c["t0"] >= a]
        steps.append({"ms": round((b - a) * 1e3, 2),
                      "prompt_tokens": sum(s.cached for s in seqs) - before,
                      "compiles": [c["name"] for c in during],
                      "compile_ms": round(sum(c.get("t1", b) - c["t0"] for c in during) * 1e3, 1)})
        for i, s in enumerate(seqs):
            if first[i] is None and s.output:
                first[i] = round((b - t0) * 1e3, 1)
        if not busy or all(s.finish_reason for s in seqs):
            break
    for _ in range(8):  # what is left of them
        if not engine.step():
            break
    return {"burst": len(prompts), "prompt": len(prompts[0]), "first_token_ms": first,
            "steps": steps}


def gpu_timeline(events) -> list[dict]:
    """Per profiled step (its `record_function` window, which ends in a device sync): the host
    window, the union of its kernels' intervals (busy), and the device's idle time inside the
    span from the first kernel's start to the last one's end (where kernels waited on the host),
    all ms. Kernels belong to the window they start in."""
    cuda = torch.autograd.DeviceType.CUDA  # the ranges show on the device too: not kernels
    windows = sorted((e.time_range.start, e.time_range.end, e.name) for e in events
                     if e.name.startswith(STEP_RANGE) and e.device_type != cuda)
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.device_type == cuda and not e.name.startswith(STEP_RANGE))
    out = []
    for start, end, name in windows:
        mine = [k for k in kernels if start <= k[0] <= end]
        if not mine:
            continue
        busy, reach = 0.0, mine[0][0]
        for a, b in mine:  # union of the intervals
            busy += max(0.0, b - max(a, reach))
            reach = max(reach, b)
        span = reach - mine[0][0]
        out.append({"step": int(name[len(STEP_RANGE):]),
                    "window_ms": round((end - start) / 1e3, 3),
                    "kernels": len(mine), "busy_ms": round(busy / 1e3, 3),
                    "span_ms": round(span / 1e3, 3), "idle_ms": round((span - busy) / 1e3, 3),
                    "lead_ms": round((mine[0][0] - start) / 1e3, 3)})
    return out


def _activities() -> list:
    """What the profiled and traced bursts record: the host, and the device where there is one."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def profiled(engine, prompts, sampling) -> dict:
    """One burst under torch.profiler (CUDA kernel time) and cProfile (host functions)."""
    host = cProfile.Profile()
    with profile(activities=_activities()) as prof:
        host.enable()
        t0 = time.perf_counter()
        result = burst(engine, prompts, sampling, "profiled")
        wall = time.perf_counter() - t0
        host.disable()
    kernels = prof.key_averages()
    key = "device_time_total" if torch.cuda.is_available() else "cpu_time_total"
    # the host's side: which ops take its time, and how many launches a burst makes
    launches = sum(e.count for e in kernels if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                         "cuLaunchKernelEx"))
    out = io.StringIO()
    pstats.Stats(host, stream=out).sort_stats("tottime").print_stats(25)
    pstats.Stats(host, stream=out).sort_stats("cumulative").print_stats("ninfer_engine", 40)
    # the kernels' own rows: an op's row counts its kernels' time again
    on_device = [e for e in kernels if e.device_type == torch.autograd.DeviceType.CUDA
                 and not e.key.startswith(STEP_RANGE)]
    kernel_ms = (sum(e.self_device_time_total for e in on_device) if on_device
                 else sum(getattr(e, key) for e in kernels)) / 1e3
    return {"wall_ms": wall * 1e3, "kernel_ms": kernel_ms, "steps": result["steps"],
            "timeline": gpu_timeline(prof.events()) if on_device else [],
            "launches": launches, "kernels": kernels.table(
                sort_by=key, row_limit=20, max_name_column_width=60) + kernels.table(
                sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60),
            "host": out.getvalue()}


def traced(engine, prompts, sampling, path: str, stacks: bool = True) -> None:
    """One burst under torch.profiler, written as a gzipped Chrome trace to `path`
    (`bench/trace_gaps.py` charges the device's idle time to the host's functions). With
    `stacks` every Python call is recorded too, which slows the host about twofold (a
    kernel-bound step turns host-bound); without, only ops and runtime calls, closer to the
    step's real timing."""
    with profile(activities=_activities(), with_stack=stacks) as prof:
        burst(engine, prompts, sampling, "traced")
    plain = path[:-3] if path.endswith(".gz") else path
    prof.export_chrome_trace(plain)
    if plain != path:
        with open(plain, "rb") as src, gzip.open(path, "wb") as dst:
            dst.write(src.read())
        Path(plain).unlink()


def syncs(engine, prompts, sampling) -> list[tuple[str, int]]:
    """One burst with CUDA's sync debug mode on: (file:line, count) of every host wait, most
    frequent first (the sampler's read of the picks is expected; one inside a forward is not)."""
    import collections
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            burst(engine, prompts, sampling, "syncs")
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter(f"{w.filename}:{w.lineno}" for w in seen
                                if "called a synchronizing" in str(w.message))
    return where.most_common()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="35b-a3b")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--weights", default="fp8-row")
    ap.add_argument("--bursts", default="1x120,8x120,8x120,1x955,8x955,8x955,3x955",
                    help="COUNTxLENGTH prompts arriving together, in turn")
    ap.add_argument("--served", action="store_true",
                    help="sample as a served request (the preset's penalties), not plain greedy")
    ap.add_argument("--prefix-reuse", action="store_true", help="keep the served prefix cache")
    ap.add_argument("--profile", metavar="COUNTxLENGTH[,...]",
                    help="those bursts again, profiled")
    ap.add_argument("--trace", metavar="COUNTxLENGTH[,...]",
                    help="those bursts again under torch.profiler with Python stacks, each "
                    "one's Chrome trace to --trace-dir (bench/trace_gaps.py reads them)")
    ap.add_argument("--trace-dir", default=".")
    ap.add_argument("--trace-light", action="store_true",
                    help="trace ops and runtime calls only, no Python stacks (less slowdown)")
    ap.add_argument("--syncs", metavar="COUNTxLENGTH",
                    help="that burst again under CUDA's sync debug mode: where the host waits")
    ap.add_argument("--prefill-chunk", type=int, default=None,
                    help="the step's prompt-token budget (default: the engine's auto, 8192 on "
                    "a CUDA device of >= 70 GiB)")
    ap.add_argument("--prefill-activations", choices=("fp8", "bf16"), default="fp8",
                    help="the engine's --prefill-activations (the experts' prompt GEMMs)")
    ap.add_argument("--gdn-walk", choices=("chunk", "split"), default="chunk",
                    help="the prompt rows' GDN walk: gdn_chunk's, or kernels.gdn_split's")
    ap.add_argument("--gdn-tiles", choices=("fp32", "bf16"), default="bf16",
                    help="the chunk walk's precompute tiles (gdn_chunk's tiles_dtype)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run (tiny-moe, say)")
    ap.add_argument("--json")
    args = ap.parse_args()
    gdn.SPLIT_WALK = args.gdn_walk == "split"
    gdn.BF16_TILES = args.gdn_tiles == "bf16"
    knobs.runtime.jit_cache_hook = _start
    knobs.runtime.jit_post_compile_hook = _end
    out = {"args": vars(args)}
    with torch.inference_mode():
        dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
        config, source = build_synthetic(args.arch, args.device, dtype, args.layers)
        config[FP8_ACTIVATIONS_KEY] = args.prefill_activations == "fp8"
        if args.device == "cuda":
            source = packed_source(source, args.weights, "auto",
                                   bf16_fits(config, free_device_bytes("cuda")))
        params = FusedParams(config, source)
        t = time.perf_counter()
        engine = bench_engine(Qwen35Model(config, params), args.arch, config, 8, 8192,
                              prefill_chunk=args.prefill_chunk, prefix_reuse=args.prefix_reuse)
        print(f"engine built with warm-up in {time.perf_counter() - t:.1f} s, "
              f"{len(COMPILES)} compiles", flush=True)
        COMPILES.clear()
        sampling = SamplingParams(temperature=0.0)
        if args.served:
            sampling = dataclasses.replace(engine.sampling_defaults, temperature=0.0)
        out["bursts"] = []
        for seed, spec in enumerate(args.bursts.split(","), 1):
            n, length = map(int, spec.split("x"))
            r = burst(engine, random_prompts(n, length, config["vocab_size"], seed=seed),
                      sampling, f"b{seed}")
            out["bursts"].append(r)
            shown = " ".join(f"{s['ms']}({s['prompt_tokens']}t" + (
                f", C{s['compile_ms']})" if s["compiles"] else ")") for s in r["steps"])
            print(f"{spec}: first tokens {r['first_token_ms']} ms; steps {shown}", flush=True)
        out["compiles"] = COMPILES
        print(f"compiles after warm-up: {len(COMPILES)}")
        for c in COMPILES:
            print(f"  {c['name']} {(c.get('t1', c['t0']) - c['t0']) * 1e3:.0f} ms  {c['variant']}")
        for spec in args.profile.split(",") if args.profile else []:
            n, length = map(int, spec.split("x"))
            p = profiled(engine, random_prompts(n, length, config["vocab_size"], seed=99),
                         sampling)
            out.setdefault("profiles", {})[spec] = {k: v for k, v in p.items()
                                                    if k not in ("kernels", "host")}
            print(f"profiled {spec}: wall {p['wall_ms']:.1f} ms, kernels "
                  f"{p['kernel_ms']:.1f} ms, {p['launches']} launches\n{p['kernels']}\n"
                  f"{p['host']}")
            for row in p["timeline"]:  # the device's busy and idle time, step by step
                print("timeline " + " ".join(f"{k} {v}" for k, v in row.items()), flush=True)
        for k, spec in enumerate(args.trace.split(",") if args.trace else []):
            n, length = map(int, spec.split("x"))
            path = str(Path(args.trace_dir) / f"trace-{spec}.json.gz")
            # a seed a trace: one seed made a 1x955 trace's prompt the 8x955's first, cached
            traced(engine, random_prompts(n, length, config["vocab_size"], seed=200 + k),
                   sampling, path, stacks=not args.trace_light)
            print(f"trace of a {spec} burst: {path}", flush=True)
        if args.syncs and args.device == "cuda":
            n, length = map(int, args.syncs.split("x"))
            out["syncs"] = syncs(engine, random_prompts(n, length, config["vocab_size"],
                                                        seed=98), sampling)
            print(f"host waits in a {args.syncs} burst:")
            for place, count in out["syncs"]:
                print(f"  {count:5d}  {place}")
        engine.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
