"""The host side of serving with the device simulated: how much of the engine's own step rate
the real HTTP server delivers when every device step takes a fixed time.

    python3 bench/served_host_model.py [MODEL.ninfer] --step-ms 1.16 --concurrency 8
        [--requests 16] [--max-tokens 256] [--switch-ms 5,0.5] [--repeat 3]
        [--label WHAT] [--out bench/results/NAME]

`--out` adds this run's rows (tagged `--label`, say the commit) to NAME.json and writes
NAME.md from all of them: run it on two versions of the tree to compare them.

The engine, scheduler, sampler, detokenizer, event pump, aiohttp server and SSE are the real
ones on the default model's tokenizer; only the runner is replaced: it sleeps `--step-ms` (plus
`--prefill-us` per prompt token) with the GIL released, as a CUDA sync does, and returns
logits that pick the next token of a fixed English text. Two figures per variant:

- engine: B requests added at once and `Engine.step()` looped on this thread (no HTTP), as
  `ninfer bench` times the step;
- served: the same engine on its thread behind `ninfer-serve`'s app, driven over loopback by
  `../shared/peers/serve_load.py` in a subprocess pinned to another core.

Their ratio is the served/engine figure of issue 18 with the device taken out: what the host
loses to Python, the GIL and the event loop. `--switch-ms` sets `sys.setswitchinterval` per
variant (CPython's default is 5 ms: a thread coming back from a device wait can wait that
long for the GIL while the HTTP thread runs).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.step.runner import _ModelRunner  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402
from ninfer_http.app import create_app  # noqa: E402
from ninfer_http.server import start_server  # noqa: E402

DEFAULT_MODEL = Path.home() / ".cache/ninfer/models/smollm2-135m-instruct.ninfer"
LOAD_TOOL = ROOT.parent / "shared/peers/serve_load.py"
# the engine-only requests' prompt: about the served ones' (329 tokens for the 1,000 characters
# of `--prompt-chars`' default, chat template included)
ENGINE_PROMPT_TOKENS = 320
# common words: every id below 4096, so the simulated logits stay narrow (see `_eager`)
TEXT = ("The people of the city met in the town house on a cold day in the early part of the "
        "year, and after a long talk about the new school, the water and the road, they decided "
        "that the work would start in the summer. ")


class SimulatedDevice(_ModelRunner):
    """Every step sleeps like a device sync; its logits pick the next token of `TEXT`."""

    def __init__(self, model, text_ids: list[int], step_s: float, prefill_s: float) -> None:
        super().__init__(model)
        self.text_ids, self.step_s, self.prefill_s = text_ids, step_s, prefill_s
        self.slept = 0.0  # the device's share of the engine thread's time

    def _eager(self, work, sampled):
        prompt_tokens = sum(len(ids) for seq, ids, _ in work if not seq.prefill_done)
        start = time.perf_counter()
        time.sleep(self.step_s + self.prefill_s * prompt_tokens)  # releases the GIL
        self.slept += time.perf_counter() - start
        rows = [seq for seq, _, _ in work if id(seq) in sampled]
        # columns up to the text's largest id only: a greedy pick reads no more, and on the
        # device the pick is device work (a full-vocabulary argmax here would be host work)
        logits = torch.zeros(len(rows), max(self.text_ids) + 1)
        for i, seq in enumerate(rows):
            # a margin that any temperature keeps certain
            logits[i, self.text_ids[len(seq.output) % len(self.text_ids)]] = 100.0
        for seq, ids, _ in work:
            seq.cached += len(ids)
        return logits


class StepClock:
    """The engine thread's time in `_step_once`, split: its own CPU time, the simulated device,
    and the rest (waiting for the GIL or the core while the HTTP thread runs)."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.steps, self.wall, self.cpu = engine, 0, 0.0, 0.0
        step_once = engine._step_once

        def timed() -> bool:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return step_once()
            finally:
                self.steps += 1
                self.wall += time.perf_counter() - wall
                self.cpu += time.thread_time() - cpu
        engine._step_once = timed

    def per_step_ms(self) -> dict:
        device = self.engine.runner.slept
        n = max(self.steps, 1)
        return {"steps": self.steps, "host_cpu_ms": round(1e3 * self.cpu / n, 3),
                "device_ms": round(1e3 * device / n, 3),
                "waiting_ms": round(1e3 * (self.wall - self.cpu - device) / n, 3)}


def simulated_engine(config: EngineConfig, args) -> Engine:
    """The engine of `config` with its runner replaced by the simulated device."""
    engine = Engine(config)
    engine.runner = SimulatedDevice(engine.model, engine.tokenizer.encode(TEXT),
                                    args.step_ms / 1e3, args.prefill_us / 1e6)
    engine._lookahead.runner = engine.runner
    return engine


def engine_rate(engine: Engine, batch: int, prompt_tokens: int, max_tokens: int) -> float:
    """Tokens per second of `Engine.step()` looped here for `batch` requests added at once."""
    seqs = []
    for i in range(batch):
        request = GenerationRequest(f"e{i}-{time.monotonic_ns()}",
                                    tuple(range(100 + i, 100 + i + prompt_tokens)),
                                    SamplingParams(temperature=0.0), max_tokens=max_tokens,
                                    ignore_eos=True)
        seqs.append(engine.add(request, lambda event: None))
    start = time.perf_counter()
    while any(seq.finish_reason is None for seq in seqs):
        engine.step()
    return sum(len(seq.output) for seq in seqs) / (time.perf_counter() - start)


async def served_rate(engine: Engine, config: EngineConfig, args, label: str) -> dict:
    server = await start_server(create_app(engine, config), "127.0.0.1", 0)
    try:
        out = Path(f"/tmp/served-host-{os.getpid()}-{label}.json")
        cmd = [sys.executable, str(args.load_tool), server.url, engine.model_id,
               "--concurrency", str(args.concurrency), "--requests", str(args.requests),
               "--max-tokens", str(args.max_tokens), "--prompt-chars", str(args.prompt_chars),
               "--ignore-eos", "--json", str(out), "--label", label]
        if os.cpu_count() and os.cpu_count() > 1:  # the client off the server's core
            cmd = ["taskset", "-c", "1", *cmd]
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.DEVNULL)
        await asyncio.wait_for(proc.wait(), timeout=600)
        return json.loads(out.read_text())
    finally:
        await server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path, nargs="?", default=DEFAULT_MODEL)
    ap.add_argument("--step-ms", type=float, default=1.16)
    ap.add_argument("--prefill-us", type=float, default=20.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-chars", type=int, default=1000)
    ap.add_argument("--switch-ms", default="5")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--label", default="")
    ap.add_argument("--load-tool", type=Path, default=LOAD_TOOL)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if os.cpu_count() and os.cpu_count() > 1:
        os.sched_setaffinity(0, {0})  # the server on one core: its threads share one GIL anyway
    torch.set_num_threads(1)
    config = EngineConfig(artifact=args.model, max_concurrency=args.concurrency,
                          max_context=8192, no_verify=True)
    rows = []
    for switch_ms in [float(s) for s in args.switch_ms.split(",")] * args.repeat:
        sys.setswitchinterval(switch_ms / 1e3)
        engine = simulated_engine(config, args)
        clock = StepClock(engine)
        alone = engine_rate(engine, args.concurrency, ENGINE_PROMPT_TOKENS, args.max_tokens)
        alone_steps = clock.per_step_ms()
        engine = simulated_engine(config, args)  # a fresh one: a stopped engine stays stopped
        clock = StepClock(engine)
        engine.start()
        cpu = time.process_time()
        served = asyncio.run(served_rate(engine, config, args, f"switch-{switch_ms}ms"))
        cpu = time.process_time() - cpu
        engine.stop()
        level = served["levels"][0]
        tokens = level["aggregate_tok_s"] * level["wall_s"]
        rows.append({"label": args.label, "switch_ms": switch_ms, "engine_tok_s": round(alone, 1),
                     "served": level,
                     "served_over_engine": round(level["aggregate_tok_s"] / alone, 3),
                     "engine_steps": alone_steps, "served_steps": clock.per_step_ms(),
                     # the server process's CPU time, less its engine thread's, per token
                     "http_cpu_us_per_token": round(1e6 * (cpu - clock.cpu) / tokens, 1)})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        _save(args, rows)


def _save(args, rows: list[dict]) -> None:
    path = args.out.with_suffix(".json")
    result = json.loads(path.read_text()) if path.exists() else {
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores "
                   f"(server pinned to core 0, load generator to core 1)",
        "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"),
        "step_ms": args.step_ms, "prefill_us": args.prefill_us, "runs": []}
    result["runs"].append({"command": shlex.join(sys.argv), "rows": rows})
    path.write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# Served over HTTP vs the engine's own step, device simulated ({args.step_ms} ms "
             "a step)", "", f"{result['machine']}, Python {result['python']}, "
             f"{result['date']}; concurrency {args.concurrency}, {args.requests} requests of "
             f"{args.max_tokens} tokens (ignore_eos), `serve_load.py` from `../shared/peers/`.",
             "", "The served requests carry the model's preset (SmolLM2: frequency_penalty 0.5; "
             "the Qwen3.5 presets have presence_penalty 1.5), the engine-only ones plain greedy, "
             "as `ninfer bench` times the step. Engine thread per step: its CPU time alone and "
             "served; HTTP: the server process's CPU time less the engine thread's, per token.",
             "", "| tree | switch ms | engine tok/s | served tok/s | per stream | TTFT ms | "
             "served / engine | engine CPU ms a step, alone / served | HTTP µs a token |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in result["runs"]:
        for row in run["rows"]:
            served = row["served"]
            steps = (f"{row['engine_steps']['host_cpu_ms']:.2f} / "
                     f"{row['served_steps']['host_cpu_ms']:.2f}" if "engine_steps" in row else "-")
            lines.append(f"| {row['label']} | {row['switch_ms']:g} | {row['engine_tok_s']:,.0f} "
                         f"| {served['aggregate_tok_s']:,.0f} | "
                         f"{served['decode_tok_s_median']:,.0f} | "
                         f"{1e3 * served['ttft_median_s']:.0f} | {row['served_over_engine']:.2f} "
                         f"| {steps} | {row.get('http_cpu_us_per_token', '-')} |")
    lines += ["", "Commands: " + "; ".join(f"`{run['command']}`" for run in result["runs"]), ""]
    path.with_suffix(".md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
