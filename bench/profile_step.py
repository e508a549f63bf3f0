"""Where one hybrid decode step (or a prefill) spends its GPU time: kernel totals, by name.

    python3 bench/profile_step.py --arch 35b-a3b [--batch 1] [--context 1024] [--layers N]
    python3 bench/profile_step.py --arch 35b-a3b --prefill 8192 [--layers N]
    python3 bench/profile_step.py --arch 27b --weights fp8-row [--cuda-weights auto|packed]
    python3 bench/profile_step.py --arch 35b-a3b --weights fp8-row --lookahead both [--host]
    python3 bench/profile_step.py --arch 35b-a3b --weights fp8-row --spec 3 [--rate 3.67]
        [--drafter oracle|mtp|free] [--verify-chain ahead|on|off] [--timeline OUT.json]

`--prefill N` profiles the model's prefill forward instead: `Qwen35Model.forward` over an N-token
prompt in 1024-token chunks, from an empty state.

Builds the synthetic model on the GPU (random weights; `--weights` a recipe, served as
`ninfer bench` serves it: `benchmark.footprint.packed_source`) inside the serving engine
(`benchmark.engine_step.bench_engine`), brings B greedy requests to `--context` tokens, times
the engine's step (`Engine.step`: schedule, the replayed CUDA graph, sampling, bookkeeping),
then profiles a few steps with torch.profiler and prints the CUDA kernels by total time: the
sum of kernel time against the step time tells host-bound from kernel-bound, and the table
names the kernels to fuse. It also replays the step's last decode graph alone, back to back (the
step without its host work); `--lookahead both` times the step with the engine's lookahead step
and then without it (`bench/results/h200-lookahead-step.md`); `--host` adds a cProfile of 200
steps on the host; `--phases` times 200 steps' host phases without a profiler
(`benchmark.host_phases`: schedule, drafts, the launch, acceptance's read-back, the rollback,
the stats, the events). `--spec K` makes every step a verify step of K drafts from the benchmark's
oracle drafter (`forced_drafts.OracleDrafter`, `--rate` tokens taken a round: random weights
accept nothing), so the times and the table are a verify step's; `--drafter mtp` drafts them
with the model's (random) MTP head as `--spec mtp` serves, the count taken still forced
(`forced_drafts.ForcedRounds`), so the step adds the drafting's cost (`--verify-chain`: on the
device, each round launched before the one before is read, `ahead`; not ahead, `on`; or from
the host, `off`: `step.verify_chain`, `step.chain_ahead`); `--drafter free` is that engine with
the chain's drafting taken out (`forced_drafts.FreeDraftRound`: fixed random drafts), the verify
cost of the device-accepted path as `oracle` gives the host-accepted one's. `--timeline OUT.json`
writes a Chrome trace of a few steps (host ops and CUDA kernels) and prints the GPU's idle gaps
within them with the host functions running meanwhile: where a step's host time goes (the
profiler's Python tracing slows the host, so read the gaps' make-up, not their length).
"""
from __future__ import annotations

import argparse
import sys
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.artifact.synth import build_synthetic  # noqa: E402
from ninfer_engine.benchmark.engine_step import (  # noqa: E402
    MARGIN, bench_engine, random_prompts, served_sampling)
from ninfer_engine.benchmark.forced_drafts import (  # noqa: E402
    ForcedRounds, FreeDraftRound, OracleDrafter)
from ninfer_engine.benchmark.footprint import packed_source  # noqa: E402
from ninfer_engine.benchmark.host_phases import HostPhases  # noqa: E402
from ninfer_engine.benchmark.timing import last_graph_ms, time_ms  # noqa: E402
from ninfer_engine.models.experts import bf16_fits, free_device_bytes  # noqa: E402
from ninfer_engine.models.fused import FusedParams  # noqa: E402
from ninfer_engine.models.qwen3_5 import Qwen35Model  # noqa: E402
from ninfer_engine.step.spec_policy import AlwaysSpeculate  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402

TIMED = 30
PHASE_STEPS = 200  # --phases


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
    ap.add_argument("--lookahead", choices=("auto", "on", "off", "both"), default="auto",
                    help="the engine's lookahead decode step (auto: on with CUDA graphs; "
                    "both: time the step with it, then without it)")
    ap.add_argument("--host", action="store_true", help="also cProfile 200 steps on the host")
    ap.add_argument("--phases", action="store_true",
                    help="also time 200 steps' host phases (`benchmark.host_phases`)")
    ap.add_argument("--spec", type=int, default=0, metavar="K",
                    help="every step verifies K oracle drafts")
    ap.add_argument("--rate", type=float, default=3.67, help="--spec's tokens taken a round")
    ap.add_argument("--drafter", choices=("oracle", "mtp", "free"), default="oracle",
                    help="--spec's drafts: random ids (no drafting cost) or the MTP head's; "
                    "free: the MTP engine's verify chain, its rounds drafting nothing")
    ap.add_argument("--sampling", choices=("greedy", "served", "preset"), default="greedy",
                    help="served: greedy with the preset's other settings (Qwen3.5: presence "
                         "penalty 1.5), as a request sending only temperature 0; preset: the "
                         "model preset's sampling (Qwen3.5: top_k 20), as a request sending none")
    ap.add_argument("--verify-chain", choices=("ahead", "on", "off"), default="ahead",
                    help="--drafter mtp|free: rounds accepted and drafted on the device "
                    "(`step.verify_chain`), each launched before the one before is read "
                    "(ahead, the default) or not (on), or accepted on the host (off)")
    ap.add_argument("--lm-head-draft", type=int, default=0, metavar="ROWS",
                    help="--drafter mtp: drafts over a proposal of the head's first ROWS rows, "
                    "as --lm-head-draft serves (the real artifacts': 131072)")
    ap.add_argument("--timeline", metavar="OUT.json",
                    help="also write a Chrome trace of a few steps and print the GPU's gaps")
    args = ap.parse_args()
    with torch.inference_mode():
        mtp = bool(args.spec) and args.drafter in ("mtp", "free")
        config, source = build_synthetic(args.arch, "cuda", torch.bfloat16, args.layers,
                                         mtp=mtp)
        fits = bf16_fits(config, free_device_bytes("cuda"))
        params = FusedParams(config, packed_source(source, args.weights, args.cuda_weights, fits))
        model = Qwen35Model(config, params)
        if args.prefill:
            return profile_prefill(model, config, args.prefill)
        total = (args.context + 8 + 3 * TIMED + args.steps + (200 if args.host else 0)
                 + (PHASE_STEPS if args.phases else 0)) * (
            1 + args.spec)
        engine = bench_engine(model, args.arch, config, args.batch, total + MARGIN,
                              draft_tokens=args.spec, cuda_weights=args.cuda_weights,
                              lookahead={"on": True, "off": False}.get(args.lookahead),
                              mtp_params=source if mtp else None,
                              verify_chain=args.verify_chain,
                              lm_head_draft=args.lm_head_draft if mtp else 0)
        oracle = nullcontext()
        if args.spec:
            engine.speculator.drafter = (
                ForcedRounds(engine.speculator.drafter, args.rate, args.spec,
                             free_drafts=args.drafter == "free") if mtp
                else OracleDrafter(args.rate, args.spec, config["vocab_size"]))
            engine.speculator.policy = AlwaysSpeculate()
            oracle = engine.speculator.drafter.forced()
        with oracle:
            _profile(engine, args, config, total)


def _profile(engine, args, config, total) -> None:
    """Prompts in, then the step timed, replayed and profiled (see the module docstring)."""
    sampling = {"served": served_sampling(engine), "preset": engine.sampling_defaults}.get(
        args.sampling, SamplingParams(temperature=0.0))
    print(f"sampling: {sampling}")
    for i, prompt in enumerate(random_prompts(args.batch, args.context, config["vocab_size"])):
        engine.add(GenerationRequest(f"p{i}", prompt, sampling,
                                     max_tokens=total, ignore_eos=True), lambda e: None)
    for _ in range(-(-args.batch * args.context // 1024) + 8):  # prompts, then warm-up
        engine.step()
    step = time_ms(engine.step, TIMED, warm_up=False)
    if args.lookahead == "both":  # the same engine and rows, its lookahead switched off
        engine._lookahead.enabled = False
        engine.step()  # settles the step in flight
        plain = time_ms(engine.step, TIMED, warm_up=False)
        print(f"lookahead on: step {step:.3f} ms, off: {plain:.3f} ms")
    replay = last_graph_ms(engine, TIMED)
    host = _host_profile(engine) if args.host else None
    if args.phases:
        with HostPhases(engine) as phases:
            for _ in range(PHASE_STEPS):
                engine.step()
        torch.cuda.synchronize()
        print(phases.report(PHASE_STEPS))
    if args.timeline:
        _timeline(engine, args.timeline)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            engine.step()
        torch.cuda.synchronize()
    if args.spec:
        stats = engine.speculator.stats()
        print(f"verify rounds {stats.rounds}, {1 + stats.accepted / max(1, stats.rounds):.2f} "
              f"tokens a round")
        drafter = engine.speculator.drafter
        round_ = getattr(drafter, "round", None)
        if isinstance(round_, FreeDraftRound):
            print("chained rounds draft nothing (fixed random drafts)")
        elif round_ is not None:  # what the captured draft round argmaxes over
            head = round_.step.draft_head
            print("draft round over " + (f"the shortlist's {head.weight.shape[0]} rows"
                                         if head is not None else "the full head"))
        chain = engine.runner.chain
        if chain is not None:  # how many went through the verify chain, and ahead
            print(f"chained rounds {chain.rounds}, launched ahead {chain.ahead}")
    engine.stop()
    events = prof.key_averages()
    kernel_ms = sum(e.device_time_total for e in events) / 1e3 / args.steps
    print(f"{args.arch} B={args.batch} ctx={args.context}: engine step {step:.2f} ms, "
          f"kernel time per step {kernel_ms:.2f} ms, the step's CUDA graph replayed alone "
          f"{replay:.2f} ms (the difference is host time the GPU waits for)")
    if host:
        print(host)
    print(events.table(sort_by="device_time_total", row_limit=25, max_name_column_width=70))


def _host_profile(engine, steps: int = 200) -> str:
    """cProfile of `steps` engine steps: the host functions by own time, then by cumulative
    time (where a step's host time goes, callers included)."""
    import cProfile
    import io
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        engine.step()
    prof.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)
    return out.getvalue()


def _timeline(engine, path: str, steps: int = 4) -> None:
    """A Chrome trace of `steps` engine steps (host ops and their CUDA kernels) at `path`, and
    the GPU's idle gaps over 20 µs between kernels with what the host began in each
    (`idle_gaps`)."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 with_stack=True) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    events = prof.events()
    kernels = [e for e in events if e.device_type.name == "CUDA"]
    busy = sum(e.time_range.end - e.time_range.start for e in kernels)
    span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)
            if kernels else 0)
    print(f"timeline: {steps} steps, {len(kernels)} kernels, trace at {path}")
    print(f"GPU busy {busy / 1e3:.2f} ms of {span / 1e3:.2f} ms between the first kernel and "
          f"the last")
    for gap, top in idle_gaps(events):
        print(f"  gap {gap / 1e3:.3f} ms: "
              + "; ".join(f"{name[:60]} {us / 1e3:.3f}" for name, us in top))


def idle_gaps(events, least_us: float = 20.0, most: int = 6) -> list[tuple[float, list]]:
    """The GPU's idle gaps among profiler `events` (µs; a gap starts when every kernel begun
    so far has ended), each with the host's own functions (`ninfer_engine/` frames) and torch
    ops begun within it, by their time inside it, the longest `most`."""
    kernels = sorted((e.time_range.start, e.time_range.end) for e in events
                     if e.device_type.name == "CUDA")
    host = [e for e in events if e.device_type.name == "CPU"
            and ("ninfer_engine/" in e.name or e.name.startswith("aten::"))]
    out, ended = [], None
    for start, end in kernels:
        if ended is not None and start - ended >= least_us:
            during: dict[str, float] = {}
            for e in host:
                if ended <= e.time_range.start < start:
                    inside = min(e.time_range.end, start) - e.time_range.start
                    during[e.name] = during.get(e.name, 0.0) + inside
            out.append((start - ended, sorted(during.items(), key=lambda kv: -kv[1])[:most]))
        ended = end if ended is None else max(ended, end)
    return out


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
