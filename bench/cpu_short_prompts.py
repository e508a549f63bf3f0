"""A short prompt's step on the CPU, in the compiled C step against the eager forward.

    python3 bench/cpu_short_prompts.py [--lengths 1,8,16,32,48,64] [--rounds 3] \
        --out bench/results/cpu-short-prompts.json

The default model (SmolLM2-135M, Q8 as stored) in the serving engine on this machine's CPU:
per prompt length, the time from adding a greedy one-token request to its end (one prompt
step, its sampling and bookkeeping), with the prompt's tokens run as rows of the C step
(`step.ragged_rows.RAGGED_PROMPT_TOKENS` as shipped) and with every prompt through the eager forward
(the cap at 0), alternating, `--rounds` times each, fresh random prompts each time and prefix
reuse off (a turn that hits the prefix cache computes only its new tokens: these lengths). The
figures are medians; `ForeignLoad` records what other processes used meanwhile.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.report import ForeignLoad, cpu_machine, write_report  # noqa: E402
from ninfer_engine.cli.flags import default_artifact  # noqa: E402
from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.step import ragged_rows  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402


def prompt_step_ms(engine: Engine, prompt: list[int], rid: str) -> float:
    events: list = []
    engine.add(GenerationRequest(rid, tuple(prompt), SamplingParams(temperature=0.0), 1),
               events.append)
    started = time.perf_counter()
    with torch.inference_mode():
        while not (events and events[-1].finish):
            engine.step()
    return (time.perf_counter() - started) * 1000


def markdown(r: dict) -> str:
    lines = ["# A short prompt's step on the CPU: the compiled C step against the eager forward",
             "", f"- machine: {r['machine']}", f"- command: `{r['command']}`, {r['date']}",
             f"- model: {r['model']}; cap (`RAGGED_PROMPT_TOKENS`): {r['cap']} tokens; other "
             f"processes' load meanwhile: {r['foreign_load_cores']:.2f} cores", "",
             "| prompt tokens | C step, median ms | eager, median ms | eager / C step |",
             "|---:|---:|---:|---:|"]
    for row in r["rows"]:
        lines.append(f"| {row['tokens']} | {row['c_step_ms']:.1f} | {row['eager_ms']:.1f} | "
                     f"{row['eager_ms'] / row['c_step_ms']:.2f}× |")
    lines += ["", "Past the cap both columns are the eager forward (the cap decides which runs)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1,8,16,32,48,64")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    cap = ragged_rows.RAGGED_PROMPT_TOKENS
    engine = Engine(EngineConfig(artifact=default_artifact(), max_context=2048,
                                 no_prefix_reuse=True))
    rng = random.Random(0)
    prompt_step_ms(engine, [rng.randrange(1000, 40000) for _ in range(8)], "warm")
    rows = []
    with ForeignLoad() as load:
        for n in map(int, args.lengths.split(",")):
            times: dict[int, list[float]] = {cap: [], 0: []}
            for i in range(args.rounds):
                for use in (cap, 0):
                    ragged_rows.RAGGED_PROMPT_TOKENS = use
                    prompt = [rng.randrange(1000, 40000) for _ in range(n)]
                    times[use].append(prompt_step_ms(engine, prompt, f"n{n}-{use}-{i}"))
            ragged_rows.RAGGED_PROMPT_TOKENS = cap
            rows.append({"tokens": n, "c_step_ms": statistics.median(times[cap]),
                         "eager_ms": statistics.median(times[0]), "c_step_all": times[cap],
                         "eager_all": times[0]})
    engine.stop()
    machine = cpu_machine()
    write_report(args.out, {
        "machine": ", ".join(f"{k} {v}" for k, v in machine.items()),
        "command": " ".join(["python3", *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "model": "SmolLM2-135M-Instruct (the default artifact, Q8 as stored)", "cap": cap,
        "foreign_load_cores": load.cores or 0.0, "rows": rows}, markdown)


if __name__ == "__main__":
    main()
