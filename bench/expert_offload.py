"""Routed experts in host RAM on the Flash-Next shape (issue 20): decode speed by the share of
experts off the device, uniform and skewed routing, beside the bytes each token needs.

One H200 call (the lead's; ~8 minutes, weights included):

    OUT=$OUT python bench/expert_offload.py --layers 16 \
        --out bench/results/h200-expert-offload

The model is `flash-next` (Qwen3-Next-80B-A3B class: 512 routed experts, top-10, I = 512,
H = 2048) cut to `--layers` layers (default 16 of 48, so the host store of every expert, ~24 GiB
page-locked, and the builds fit in one call), random weights drawn on the device once, routed
experts stored fp8-row (`--recipe`). Each configuration builds the serving model over those
weights and times `Engine.step`, in this order (the issue's targets first, so a run cut short by
--budget-s keeps them):

- every expert stacked on the device: the CUDA-graph step, the reference;
- the tier with every expert in a slot (512 slots: all hits), the cost of the path alone;
- 50 %, 80 % and 25 % of the routed experts off the device (`round((1 − share) · 512)` slots
  a layer, every expert in the host store; the issue's shares); `--shares` adds others.

Misses: `--miss auto` (default) is the captured step that reads misses in place from
page-locked host memory and admits experts between steps (`experts.in_place`); `copy` / `cpu`
the uncaptured step of before (a host sync a MoE layer). `--eager-too` adds the uncaptured
copy step's rows beside the captured ones. Each at

- B = 1: one request, a 64-token prompt, then `--steps` decode steps (after 8 warm-up ones);
- B = 8: eight requests decoded together, aggregate tok/s over the same number of steps.

Beside each figure: the decode window's slot hit rate, CPU share of the routed pairs, host
bytes per token (read in place by the kernels, copied into slots, read by CPU-computed
experts) and the arithmetic of what a uniform token needs (k · layers · share · expert bytes)
with the host → device bandwidth measured in the same run, whose ratio bounds tok/s when every
miss crosses the bus once. Skewed routing: router rows scaled by rank^-0.3
(`benchmark.routing_skew`), whose measured popularity (share of routed pairs to the hottest
20 % of experts) is reported. `--smoke` runs tiny-moe on the CPU (orchestration only: its
numbers mean nothing). Writes `<out>.json` and `<out>.md` after every configuration.

`--arch 35b-a3b --layers 40` runs the 35B-A3B shape whole (256 experts, top-8; host store
~30 GiB), the shape llama.cpp's `-ncmoe` was measured on with the same H200 machine
(`../shared/peers/README.md`: Q8_0, 16 host cores; 50 % of the experts on the host kept 37 %
of its all-GPU decode, 80 % kept 26 %; it computes them on the CPU, where this tier caches them
in device slots).
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch

from ninfer_engine.artifact.synth import build_synthetic
from ninfer_engine.benchmark.engine_step import bench_engine, random_prompts
from ninfer_engine.benchmark.footprint import packed_source
from ninfer_engine.experts.handoff_policy import AGAINST, WINDOW
from ninfer_engine.benchmark.timing import last_graph_ms
from ninfer_engine.benchmark.routing_skew import skewed_routers, top_share
from ninfer_engine.experts import ExpertPlacement
from ninfer_engine.experts.loading import served_expert_bytes
from ninfer_engine.experts.placement import moe_layers
from ninfer_engine.experts.tiers import ExpertTiers, expert_name
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from ninfer_engine.types import GenerationRequest, SamplingParams

# (share of the experts off the device, through the tier?) in the order run: the reference,
# the tier's path alone (every expert in a slot), then the targets
CONFIGS = ((0.0, False), (0.0, True), (0.5, True), (0.8, True), (0.25, True))
SKEW = 0.3
WARM, PROMPT = 8, 64
MB = 1e6


def log(message: str) -> None:
    print(f"[{time.strftime('%T')}] {message}", file=sys.stderr, flush=True)


def host_bandwidth(device: torch.device) -> dict:
    """GB/s of a 1 GiB page-locked host → device copy and of a host memcpy."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(n, dtype=torch.uint8, device=device)
    host = torch.empty(n, dtype=torch.uint8)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def rate(fn) -> float:
        best = float("inf")
        for _ in range(3):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            best = min(best, time.perf_counter() - t)
        return n / best / 1e9

    return dict(h2d_gbps=rate(lambda: dst.copy_(src, non_blocking=True)),
                host_memcpy_gbps=rate(lambda: host.copy_(src)))


def memo(source):
    """Each parameter drawn (and encoded) once, shared by every configuration's model."""
    kept = {}

    def params(name, shape):
        if name not in kept:
            kept[name] = source(name, shape)
        return kept[name]
    return params


def build(config, source, share, tiered, skew, miss, prefetch, device, cpu_share=None):
    """The serving model over `source`: every expert stacked on the device, or a tier."""
    source = skewed_routers(source, skew)
    tiers = None
    if tiered:
        def get(layer, e, member, shape):
            return source(expert_name(layer, e, member), shape)
        expert_bytes = served_expert_bytes(config, get)
        slots = max(1, round((1 - share) * config["num_experts"]))
        placement = ExpertPlacement(config["num_experts"], moe_layers(config), slots,
                                    expert_bytes)
        tiers = ExpertTiers(config, placement, get, device, miss, prefetch=prefetch,
                            cpu_share=cpu_share)
        source = tiers.placeholders(source)
    params = FusedParams(config, source, tiers) if device.type == "cuda" else source
    model = Qwen35Model(config, params)
    if tiers is not None:
        tiers.install(model)
    return model, tiers


def counters(tiers) -> dict:
    if tiers is None:
        return dict(hits=0, misses=0, cpu_pairs=0, device_pairs=0, bytes_copied=0,
                    cpu_experts=0, prefetched=0, read_pairs=0, admitted=0)
    layers = tiers.layers.values()
    reads = [t.in_place for t in layers if t.in_place is not None]
    return dict(hits=sum(t.map.hits for t in layers), misses=sum(t.map.misses for t in layers),
                cpu_pairs=sum(t.cpu_pairs for t in layers),
                device_pairs=sum(t.device_pairs for t in layers),
                bytes_copied=sum(t.bytes_copied for t in layers),
                cpu_experts=sum(t.cpu_experts for t in layers),
                prefetched=sum(t.prefetched for t in layers),
                read_pairs=sum(r.read_pairs for r in reads),
                admitted=sum(r.admitted for r in reads))


def _core(engine):
    return getattr(getattr(engine.runner.graphs, "decoder", None), "core", None)


def host_jobs(engine) -> tuple[int, int, float]:
    """(pairs, jobs, seconds) the captured step's host jobs ran so far (`experts.host_jobs`)."""
    core = _core(engine)
    return (0, 0, 0.0) if core is None else core.host_jobs.totals()


def settle(engine) -> float:
    """Hand the last decode step's routing to the tiers now (the captured step's tiers count a
    step after the next one is launched, `experts.in_place`); the host seconds spent settling
    so far (0 without a routing log)."""
    core = _core(engine)
    if core is None:
        return 0.0
    core.settle()
    return core.routing.seconds


def decode(engine, tiers, batch: int, steps: int, vocab: int, seed: int) -> dict:
    """Prefill `batch` prompts, `WARM` decode steps (with `auto`'s hand-off policy, as many
    more as it needs to decide: the window is the form it settled on), then `steps` timed
    ones."""
    policy = getattr(tiers, "handoff", None)
    warm = WARM + (AGAINST * WINDOW if policy is not None else 0)
    seqs = []
    for i, prompt in enumerate(random_prompts(batch, PROMPT, vocab, seed)):
        request = GenerationRequest(f"b{batch}-{i}", prompt, SamplingParams(temperature=0.0),
                                    max_tokens=warm + steps + 4, ignore_eos=True)
        seq = engine.add(request, lambda event: None)
        if seq is None:
            raise RuntimeError("the engine refused a benchmark request")
        seqs.append(seq)
    while not all(s.prefill_done for s in seqs):
        engine.step()
    for _ in range(warm):
        engine.step()
    settled = settle(engine)  # the warm-up's routing into the counters before the window
    switches = policy.switches if policy is not None else 0
    before, emitted = counters(tiers), sum(len(s.output) for s in seqs)
    jobs_before = host_jobs(engine)
    sync = torch.cuda.synchronize if engine.model.device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    sync()
    seconds = time.perf_counter() - start
    tokens = sum(len(s.output) for s in seqs) - emitted
    settled = settle(engine) - settled  # the last timed step's routing
    jobs = [b - a for a, b in zip(jobs_before, host_jobs(engine))]
    after = counters(tiers)
    d = {k: after[k] - before[k] for k in after}
    while engine.step():  # the requests run out
        pass
    lookups, pairs = d["hits"] + d["misses"], d["cpu_pairs"] + d["device_pairs"]
    expert_bytes = tiers.placement.expert_bytes if tiers else 0
    return dict(batch=batch, tokens=tokens, seconds=seconds, tok_s=tokens / seconds,
                hit_rate=d["hits"] / lookups if lookups else None,
                cpu_share=d["cpu_pairs"] / pairs if pairs else 0.0,
                copied_mb_per_token=d["bytes_copied"] / tokens / MB,
                read_mb_per_token=d["read_pairs"] * expert_bytes / tokens / MB,
                admitted_per_token=d["admitted"] / tokens,
                settle_ms_per_step=1e3 * settled / steps,  # host, overlapping the step
                cpu_read_mb_per_token=d["cpu_experts"] * expert_bytes / tokens / MB,
                host_job_pairs_per_token=jobs[0] / tokens,
                host_job_ms_per_step=1e3 * jobs[2] / steps,  # inside the step, per step
                prefetched_per_token=d["prefetched"] / tokens,
                handoff=None if policy is None else ("on" if policy.on else "off"),
                handoff_switches=0 if policy is None else policy.switches - switches)


def profiled(engine, tiers, vocab: int, steps: int = 12) -> dict:
    """`--profile`: one B = 1 request's decode steps under torch.profiler: the engine step, the
    kernel time a step (their difference: host time the GPU waited for), its decode graph
    replayed alone back to back, and the kernels by time a step."""
    from torch.profiler import ProfilerActivity, profile
    request = GenerationRequest("profile", random_prompts(1, PROMPT, vocab, 7)[0],
                                SamplingParams(temperature=0.0),
                                max_tokens=2 * WARM + 2 * steps + 8, ignore_eos=True)
    seq = engine.add(request, lambda event: None)
    while not seq.prefill_done:
        engine.step()
    for _ in range(WARM):
        engine.step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
        step_ms = 1e3 * (time.perf_counter() - start) / steps
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    replay_ms = last_graph_ms(engine)
    while engine.step():
        pass
    settle(engine)
    return dict(step_ms=step_ms, replay_ms=replay_ms,
                kernel_ms=sum(e.device_time_total for e in events) / 1e3 / steps,
                kernels=[(e.key[:90], e.device_time_total / 1e3 / steps, e.count / steps)
                         for e in events[:12]])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=("flash-next", "35b-a3b"), default="flash-next")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--recipe", default="fp8-row")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--miss", choices=("auto", "read", "copy", "cpu"), default="auto")
    ap.add_argument("--eager-too", action="store_true",
                    help="also the uncaptured copy step (--expert-miss copy) at each share")
    ap.add_argument("--shares", type=float, nargs="*", default=[],
                    help="more shares off the device after the default ones (0.25 say)")
    ap.add_argument("--out", default="bench/results/h200-expert-offload")
    ap.add_argument("--prefetch", action="store_true",
                    help="copy the next MoE layer's guessed experts ahead (--expert-prefetch)")
    ap.add_argument("--budget-s", type=float, default=480,
                    help="start no configuration after this many seconds (one device call)")
    ap.add_argument("--smoke", action="store_true", help="tiny-moe on the CPU (orchestration)")
    ap.add_argument("--profile", action="store_true",
                    help="with each configuration, a B = 1 kernel table (CUDA only)")
    ap.add_argument("--cpu-shares", nargs="*", type=lambda v: v if v == "auto" else float(v),
                    default=[0.0], metavar="F|auto",
                    help="each tier configuration once per share of the experts computed on "
                    "the host's cores while missed (--expert-cpu-share; 0: none)")
    ap.add_argument("--cpu-prefetch", type=int, default=None, metavar="BYTES",
                    help="the host expert kernel's prefetch distance (kernels.cpu_experts."
                    "use_prefetch; default: the kernel's own)")
    ap.add_argument("--cpu-team", choices=("spin", "openmp"), default="spin",
                    help="the team the worker's host jobs run on (kernels.cpu_experts."
                    "use_spinning_team; default: spin, the engine's)")
    ap.add_argument("--only", nargs="*", default=None, metavar="SHARE:TIER:ROUTING",
                    help="run only these configurations (0.5:tier:skewed, 0:stacked:uniform)")
    args = ap.parse_args()
    if args.cpu_prefetch is not None or args.cpu_team != "spin":
        from ninfer_engine.kernels.cpu_experts import use_prefetch, use_spinning_team
        use_prefetch(-1 if args.cpu_prefetch is None else args.cpu_prefetch)
        use_spinning_team(int(args.cpu_team == "spin"))
    began, skipped = time.perf_counter(), []
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    arch = "tiny-moe" if args.smoke else args.arch
    layers = None if args.smoke else args.layers
    recipe = "bf16" if args.smoke else args.recipe
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    result = dict(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        command=" ".join(sys.argv), arch=arch, recipe=recipe, miss=args.miss,
        prefetch=args.prefetch, cpu_prefetch=args.cpu_prefetch, cpu_team=args.cpu_team,
        routing={"uniform": "random router rows", "skewed": f"router rows × rank^-{SKEW}"},
        machine=dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                     torch=torch.__version__, python=platform.python_version(),
                     **host_bandwidth(device)),
        rows=[])
    config, source = build_synthetic(arch, device, dtype, layers)
    source = memo(packed_source(source, recipe, "auto", True))
    k, L = config["num_experts_per_tok"], len(moe_layers(config))
    result.update(layers=config["num_hidden_layers"], moe_layers=L, top_k=k,
                  experts=config["num_experts"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    configs = [(share, tiered, args.miss) for share, tiered in CONFIGS]
    configs += [(share, True, args.miss) for share in args.shares]
    if args.eager_too:  # the uncaptured step of before, beside the captured one
        configs += [(share, True, "copy") for share, tiered in CONFIGS if tiered]
    configs = [(share, tiered, miss, c) for share, tiered, miss in configs
               for c in (args.cpu_shares if tiered and share > 0 else [0.0])]
    for share, tiered, miss, cpu_share in configs:
        for routing, skew in (("uniform", 0.0), ("skewed", SKEW)):
            name = f"{share:g}:{'tier' if tiered else 'stacked'}:{routing}"
            if args.only is not None and name not in args.only:
                continue
            if time.perf_counter() - began > args.budget_s:
                skipped.append(dict(routing=routing, host_share=share, tier=tiered, miss=miss))
                result["not_measured"] = dict(reason=f"--budget-s {args.budget_s:.0f} spent",
                                              configs=skipped)
                continue
            log(f"{routing} routing, {share:.0%} of the experts off the device"
                + (" (tier)" if tiered else ""))
            t = time.perf_counter()
            model, tiers = build(config, source, share, tiered, skew, miss, args.prefetch,
                                 device, cpu_share)
            engine = bench_engine(model, arch, config, 8, 1024)
            built = time.perf_counter() - t
            graphs = engine.runner.graphs
            step = "graph step" if graphs is not None and graphs.capture else "eager step"
            marks = (f"auto {tiers.cpu_share:.2f}" if cpu_share == "auto" else
                     f"{tiers.cpu_share:.2f}" if tiers else "")
            if tiers and tiers.auto_seconds:
                log("  auto: " + ", ".join(f"{name} {1e6 * s:.1f} us"
                                           for name, s in tiers.auto_seconds.items()))
            for batch in (1, 8):
                row = dict(routing=routing, host_share=share, build_s=built,
                           miss=miss if tiers else None,
                           path=f"tier ({miss}, CPU {marks}), {step}" if tiers
                           else f"all stacked, {step}",
                           cpu_share_marked=tiers.cpu_share if tiers else 0.0,
                           cpu_share_asked=cpu_share,
                           auto_us={n: 1e6 * s for n, s in tiers.auto_seconds.items()}
                           if tiers else {},
                           slots=tiers.placement.slots if tiers else config["num_experts"],
                           **decode(engine, tiers, batch, args.steps, config["vocab_size"],
                                    seed=batch))
                eb = tiers.placement.expert_bytes if tiers else 0
                row.update(expert_mb=eb / MB,
                           uniform_host_mb_per_token=k * L * share * eb / MB,
                           miss_cost=asdict(tiers.costs) if tiers else None)
                if tiers:
                    row["top20_share"] = top_share(
                        [sum(c) for c in zip(*(t.routed for t in tiers.layers.values()))], 0.2)
                result["rows"].append(row)
                log(f"  B={batch}: {row['tok_s']:.1f} tok/s, hit {row['hit_rate']}, "
                    f"cpu {row['cpu_share']:.2f}, {row['read_mb_per_token']:.1f} MB/token "
                    f"read, {row['copied_mb_per_token']:.1f} copied"
                    + (f", hand-off {row['handoff']}" if row.get("handoff") else ""))
            if args.profile and device.type == "cuda":
                result["rows"][-2]["profile"] = profiled(engine, tiers, config["vocab_size"])
                p = result["rows"][-2]["profile"]
                log(f"  profile B=1: step {p['step_ms']:.3f} ms, kernels {p['kernel_ms']:.3f}"
                    f" ms, graph alone {p['replay_ms']:.3f} ms")
            engine.stop()
            # (`graphs` too: it holds the model, whose device slots the next build needs)
            del engine, model, tiers, graphs
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            write(out, result)
    write(out, result)
    return 0


def write(out: Path, result: dict) -> None:
    """The JSON and the markdown so far (a run cut short keeps what it measured)."""
    Path(f"{out}.json").write_text(json.dumps(result, indent=1))
    Path(f"{out}.md").write_text(report(result))


def report(r: dict) -> str:
    base = {(row["routing"], row["batch"]): row["tok_s"] for row in r["rows"]
            if row["path"].startswith("all stacked")}
    m = r["machine"]
    lines = [
        f"# Routed experts off the device: {r['arch']}, {r['layers']} layers, {r['recipe']}",
        "",
        f"{r['date']}, {m['device']}, torch {m['torch']}; `{r['command']}`. Host → device "
        f"{m['h2d_gbps']:.1f} GB/s (1 GiB page-locked copy), host memcpy "
        f"{m['host_memcpy_gbps']:.1f} GB/s. Top-{r['top_k']} of {r['experts']} experts in "
        f"{r['moe_layers']} MoE layers; misses: {r['miss']}; next-layer prefetch: "
        f"{'on' if r['prefetch'] else 'off'}. Skewed routing: "
        f"{r['routing']['skewed']} (top-20 % share measured per row).",
        "",
        "| routing | off device | path | slots | B | tok/s | × all-on-device | hit rate "
        "| CPU share | MB/token read in place | MB/token copied | MB/token CPU-read "
        "| uniform need MB/token | bound tok/s | top-20 % share | settle ms/step "
        "| host job ms/step |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(row) -> str:
        all_on = base.get((row["routing"], row["batch"]))
        return f"{row['tok_s'] / all_on:.2f}" if all_on else ""

    for row in r["rows"]:
        need = row["uniform_host_mb_per_token"]
        bound = m["h2d_gbps"] * 1e3 / need if need and row["batch"] == 1 else None
        hit = "" if row["hit_rate"] is None else f"{row['hit_rate']:.1%}"
        top = f"{row['top20_share']:.0%}" if "top20_share" in row else ""
        lines.append(
            f"| {row['routing']} | {row['host_share']:.0%} | {row['path']}"
            f"{', hand-off off' if row.get('handoff') == 'off' else ''} | {row['slots']} "
            f"| {row['batch']} "
            f"| {row['tok_s']:.1f} | {ratio(row)} "
            f"| {hit} | {row['cpu_share']:.1%} | {row.get('read_mb_per_token', 0):.1f} "
            f"| {row['copied_mb_per_token']:.1f} "
            f"| {row['cpu_read_mb_per_token']:.1f} | {need:.1f} "
            f"| {'' if bound is None else f'{bound:.1f}'} | {top} "
            f"| {row.get('settle_ms_per_step', 0):.3f} "
            f"| {row.get('host_job_ms_per_step', 0):.3f} |")
    lines += ["", "`bound tok/s`: host → device bandwidth / the uniform need (every missed "
              "expert crossing the bus once per token, nothing else in the step), per sequence "
              "at B = 1. `graph step`: the captured step (misses read in place from page-locked "
              "memory, admitted between steps); `eager step`: uncaptured (a host sync a MoE "
              "layer); `hand-off off`: `auto`'s policy took the hand-off to the cores out of the "
              "step (`experts.handoff_policy`: it saved less than its kernels cost) during the "
              "warm-up. `settle ms/step`: the host's bookkeeping of the captured step's routing "
              "(counts, admissions, table push), run while the GPU computes the next step: "
              "where it nears the step time the host bounds the rate. `CPU` in the path: the "
              "share of the experts computed on the host's cores when missed (`experts.host_jobs`, "
              "inside the captured step, `--expert-cpu-share`); `host job ms/step`: the "
              "cores' time in those jobs a step."]
    profiled_rows = [row for row in r["rows"] if "profile" in row]
    if profiled_rows:
        lines += ["", "B = 1 under torch.profiler (`--profile`): the engine step, the kernel time "
                  "a step (the difference is host time the GPU waited for), the decode graph "
                  "replayed alone, the three costliest kernels (ms a step, launches a step).", "",
                  "| routing | off device | path | step ms | kernels ms | graph alone ms "
                  "| top kernels |", "|---|---|---|---|---|---|---|"]
        for row in profiled_rows:
            p = row["profile"]
            top = "; ".join(f"`{n[:48]}` {ms:.3f} ({c:.0f})" for n, ms, c in p["kernels"][:3])
            lines.append(f"| {row['routing']} | {row['host_share']:.0%} | {row['path']} "
                         f"| {p['step_ms']:.3f} | {p['kernel_ms']:.3f} | {p['replay_ms']:.3f} "
                         f"| {top} |")
    if "not_measured" in r:
        lines += ["", f"Not measured ({r['not_measured']['reason']}): "
                  + ", ".join(f"{c['routing']} {c['host_share']:.0%}"
                              + (f" tier ({c['miss']})" if c["tier"] else "")
                              for c in r["not_measured"]["configs"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
