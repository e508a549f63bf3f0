"""Time to first token of a turn whose prefix sits in the prefix cache's host tier, beside a cold
prefill and a device hit, on the serving engine (`Engine.step`) with random weights on CUDA.

The pool holds one long prompt: conversation A (a `--prompt`-token prompt) runs, then B (as
long, different) takes A's pages; A's next turn (A + 64 tokens) then restores A from the host
tier (`--host-kv-mib` sized to hold A, `--host-state-slots 32`), or, in an engine without the
tier, prefills it all again. A device hit (A's next turn straight after A) is timed too. Each
engine runs this 1 + `PASSES` times, each pass on other prompts: the table gives the medians of
the last `PASSES` (the first, which compiles and first-uses what a 32K prompt needs, is kept in
the JSON as `first_pass`).

    python bench/host_tier_ttft.py --arch 35b-a3b --weights fp8-row --prompt 32768 --out DIR

`--profile`: after the passes, a device hit's turn (device only) and a cold prompt (with the
tier) under `torch.profiler` (CPU and CUDA), their top ops by self CUDA time and by self CPU
time written beside the table (`*-profile.txt`): where a 64-token turn over a long cached prefix
spends its time, and what the tier adds to a cold prefill.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from ninfer_engine.artifact.synth import build_synthetic
from ninfer_engine.benchmark.engine_step import SyntheticResources, random_prompts, run_requests
from ninfer_engine.benchmark.footprint import packed_source
from ninfer_engine.config import PAGE_TOKENS, EngineConfig
from ninfer_engine.engine import Engine
from ninfer_engine.models.experts import bf16_fits, free_device_bytes
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model

TURN = 64  # the new tokens of the next turn
PASSES = 3  # measured passes: the table gives each time's median (a 64-token turn is ~20 ms)
# room for both prompts' snapshots (every --prefill-chunk, one before the end, the answer's)
HOST_STATE_SLOTS = 32


def engine_for(model, arch, config, prompt: int, host_mib: int, chunk: int) -> Engine:
    pool = -(-(prompt + 2 * TURN + 2 * PAGE_TOKENS) // PAGE_TOKENS) * PAGE_TOKENS
    engine_config = EngineConfig(
        artifact=Path(f"synth-{arch}"), max_concurrency=1, max_context=pool, kv_capacity=pool,
        prefill_chunk=chunk, host_kv_mib=host_mib or None,
        host_state_slots=HOST_STATE_SLOTS if host_mib else None)
    return Engine(engine_config, SyntheticResources(arch, config), model=model)


def ttft(engine: Engine, prompt: tuple[int, ...]) -> tuple[float, int]:
    """(seconds to the first token, prompt tokens restored) for one greedy request."""
    before = engine.memory.hit_tokens
    run = run_requests(engine, [prompt], 1)
    torch.cuda.synchronize()
    return run.first_token_s[0], engine.memory.hit_tokens - before


def passed(engine: Engine, vocab: int, length: int, seed: int) -> tuple[dict, tuple[int, ...]]:
    """One pass of the protocol on fresh prompts: (its TTFTs and tokens reused, prompt A)."""
    a, b = random_prompts(2, length, vocab, seed=seed)
    turns = random_prompts(2, TURN, vocab, seed=seed + 1)
    cold, _ = ttft(engine, a)
    device_hit, device_reused = ttft(engine, a + turns[0])
    ttft(engine, b)  # takes A's pages
    after, reused = ttft(engine, a + turns[1])
    return dict(cold_ttft_s=cold, device_hit_ttft_s=device_hit, device_hit_reused=device_reused,
                after_eviction_ttft_s=after, after_eviction_reused=reused), a


def profiled_turn(engine: Engine, prompt: tuple[int, ...], label: str) -> str:
    """A turn under the profiler: its top ops by self CUDA and by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        seconds, reused = ttft(engine, prompt)
    table = prof.key_averages()
    return (f"{label}: {seconds * 1e3:.1f} ms to the first token, {reused} tokens reused "
            "(under the profiler)\n\n"
            + table.table(sort_by="self_cuda_time_total", row_limit=25) + "\n"
            + table.table(sort_by="self_cpu_time_total", row_limit=25) + "\n")


def python_profiled_turn(engine: Engine, prompt: tuple[int, ...], label: str) -> str:
    """A turn under cProfile (the host's Python, its waits on the device included): its
    engine steps' times and the top functions by cumulative and by own time."""
    import cProfile
    import io
    import pstats

    before = engine.memory.hit_tokens
    profiler = cProfile.Profile()
    profiler.enable()
    run = run_requests(engine, [prompt], 1)
    torch.cuda.synchronize()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(30)
    steps = ", ".join(f"{s * 1e3:.1f}" for s in run.step_s)
    return (f"{label}: {run.first_token_s[0] * 1e3:.1f} ms to the first token, "
            f"{engine.memory.hit_tokens - before} tokens reused, engine steps {steps} ms "
            f"(under cProfile)\n\n{out.getvalue()}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="35b-a3b")
    parser.add_argument("--weights", default="fp8-row")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=32768)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--python-profile", action="store_true",
                        help="a device hit's turn under cProfile after the passes (device only)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("host_tier_ttft: needs a CUDA device", file=sys.stderr)
        return 1
    config, source = build_synthetic(args.arch, "cuda", torch.bfloat16, args.layers)
    fits = bf16_fits(config, free_device_bytes("cuda"))
    model = Qwen35Model(config, FusedParams(config, packed_source(source, args.weights, "auto",
                                                                   fits)))
    vocab = config["vocab_size"]
    rows, profiles = {}, []
    for label, host in (("device only", False), ("device + host tier", True)):
        probe = engine_for(model, args.arch, config, args.prompt, 0, args.chunk)
        page_bytes = probe.memory.storage.page_bytes
        del probe
        host_mib = -(-(args.prompt // PAGE_TOKENS + 4) * page_bytes // 2**20) if host else 0
        engine = engine_for(model, args.arch, config, args.prompt, host_mib, args.chunk)
        # seeds 1, 3, 5, ...: each pass draws its A and B from one seed, its turns from the next
        first = passed(engine, vocab, args.prompt, seed=1)  # compiles, first uses: apart
        passes = [passed(engine, vocab, args.prompt, seed=3 + 2 * i) for i in range(PASSES)]
        a = passes[-1][1]
        row = {key: statistics.median(p[0][key] for p in passes) for key in passes[0][0]}
        if args.profile:  # device only: a device hit's turn; with the tier: a cold prompt's
            prompt = a + random_prompts(1, TURN, vocab, seed=99)[0] if not host else \
                random_prompts(1, args.prompt, vocab, seed=98)[0]
            profiles.append(profiled_turn(engine, prompt, "device hit" if not host else "cold"))
        if args.python_profile and not host:
            prompt = a + random_prompts(1, TURN, vocab, seed=97)[0]
            profiles.append(python_profiled_turn(engine, prompt, "device hit"))
        row["passes"] = [p[0] for p in passes]
        prefix = engine.snapshot().prefix
        rows[label] = dict(row, host_kv_mib=host_mib, first_pass=first[0],
                           host_restored_pages=prefix.host_restored_pages,
                           speedup_vs_cold=row["cold_ttft_s"] / row["after_eviction_ttft_s"])
        del engine
        torch.cuda.empty_cache()
    result = dict(
        machine=f"{torch.cuda.get_device_name()}, torch {torch.__version__}, Python "
                f"{platform.python_version()}",
        command="python " + " ".join(sys.argv), date=datetime.now(timezone.utc).isoformat(),
        arch=args.arch, weights=args.weights, layers=config["num_hidden_layers"],
        prompt_tokens=args.prompt, turn_tokens=TURN, rows=rows)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"h200-host-tier-ttft-{args.arch}"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Host tier: TTFT of a turn whose {args.prompt}-token prefix was evicted",
             "", f"- machine: {result['machine']}", f"- command: `{result['command']}`, "
             f"{result['date']}", f"- {args.arch} ({result['layers']} layers), {args.weights}, "
             "random weights; a pool that holds one prompt: A, then B (takes A's pages), then "
             f"A + {TURN} tokens", "",
             "| engine | cold prefill | device hit (reused) | after eviction (reused) | "
             "cold / after eviction |", "|---|---|---|---|---|"]
    for label, r in rows.items():
        lines.append(f"| {label} | {r['cold_ttft_s'] * 1e3:.0f} ms | "
                     f"{r['device_hit_ttft_s'] * 1e3:.0f} ms ({r['device_hit_reused']}) | "
                     f"{r['after_eviction_ttft_s'] * 1e3:.0f} ms ({r['after_eviction_reused']})"
                     f" | {r['speedup_vs_cold']:.1f}x |")
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    if profiles:
        suffix = "-python-profile" if args.python_profile and not args.profile else "-profile"
        (args.out / f"{name}{suffix}.txt").write_text("\n".join(profiles))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
