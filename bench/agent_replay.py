"""Agent replay (issue 22): N conversations x T turns sharing one long system prompt, interleaved,
more conversations than the device KV pool holds, replayed on the serving engine (`Engine.step`)
three times: prefix cache off, device only, device + host tier.

Turn t of agent a is the system prompt, the agent's earlier turns (its user tokens and the
answers the engine gave) and `--user` new tokens (a tool result); each answer is `--answer`
greedy tokens. Turns go round-robin over the agents, `--concurrency` requests at a time. Per
request: time to first token (queue wait included), prompt tokens restored from the cache, the
reuse path, host pages restored. Reported per turn and overall: TTFT p50/p99, hit rate,
computed-prefill tokens (against the cache-off run).

CPU, the default model (llama family), a small shape:
    .venv/bin/python bench/agent_replay.py --agents 4 --turns 4 --system 1024 --user 64 \\
        --answer 8 --out bench/results/cpu-agent-replay
H200, the 35B-A3B shape cut to 8 layers (random weights, hybrid family):
    python bench/agent_replay.py --arch 35b-a3b --layers 8 --weights fp8-row --agents 16 \\
        --turns 12 --system 12288 --user 512 --answer 64 --concurrency 4 \\
        --out bench/results/h200-agent-replay-35b-a3b
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.report import cpu_machine, write_report  # noqa: E402
from ninfer_engine.benchmark.engine_step import random_prompts  # noqa: E402
from ninfer_engine.config import PAGE_TOKENS, EngineConfig  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.types import GenerationRequest, SamplingParams  # noqa: E402

MODES = ("cache off", "device only", "device + host")
GREEDY = SamplingParams(temperature=0.0)


def build(args, mode: str, model_parts) -> Engine:
    """An engine whose device pool holds `--device-conversations` final-length conversations
    (fewer than the agents), with the host tier sized for all of them in the last mode."""
    final = args.system + args.turns * (args.user + args.answer) + PAGE_TOKENS
    pool = -(-final * args.device_conversations // PAGE_TOKENS) * PAGE_TOKENS
    fields = dict(max_concurrency=args.concurrency, max_context=final + PAGE_TOKENS,
                  kv_capacity=max(pool, final + PAGE_TOKENS), prefill_chunk=args.chunk,
                  no_prefix_reuse=mode == "cache off")
    if mode == "device + host":
        fields.update(host_kv_mib=args.host_kv_mib, host_state_slots=4 * args.agents)
    if model_parts is None:
        from ninfer_engine.cli.flags import default_artifact

        path = args.model or default_artifact(os.environ)
        return Engine(EngineConfig(artifact=Path(path), **fields))
    model, resources = model_parts
    return Engine(EngineConfig(artifact=Path(resources.name), **fields), resources, model=model)


def synthetic(args):
    """(model, resources) of a synthesized shape on CUDA (random weights)."""
    from ninfer_engine.artifact.synth import build_synthetic
    from ninfer_engine.benchmark.engine_step import SyntheticResources
    from ninfer_engine.benchmark.footprint import packed_source
    from ninfer_engine.models.experts import bf16_fits, free_device_bytes
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model

    config, source = build_synthetic(args.arch, "cuda", torch.bfloat16, args.layers)
    fits = bf16_fits(config, free_device_bytes("cuda"))
    model = Qwen35Model(config, FusedParams(config, packed_source(source, args.weights, "auto",
                                                                   fits)))
    return model, SyntheticResources(args.arch, config)


def replay(engine: Engine, args, vocab: int) -> list[dict]:
    """Every request's record, in submission order."""
    system = random_prompts(1, args.system, vocab, seed=1)[0]
    history = [system] * args.agents
    users = random_prompts(args.agents * args.turns, args.user, vocab, seed=2)
    order = [(turn, agent) for turn in range(args.turns) for agent in range(args.agents)]
    records = []
    for start in range(0, len(order), args.concurrency):
        wave, seqs = order[start: start + args.concurrency], []
        submitted = time.perf_counter()
        for turn, agent in wave:
            prompt = history[agent] + users[turn * args.agents + agent]
            request = GenerationRequest(f"a{agent}-t{turn}", prompt, GREEDY,
                                        max_tokens=args.answer, ignore_eos=True)
            seq = engine.add(request, lambda event: None)
            if seq is None:
                raise RuntimeError("the engine refused a replay request")
            seqs.append(seq)
        first: list[float | None] = [None] * len(seqs)
        while engine.step():
            now = time.perf_counter()
            for i, s in enumerate(seqs):
                if first[i] is None and s.output:
                    first[i] = now - submitted
        if args.cuda:
            torch.cuda.synchronize()
        for (turn, agent), seq, ttft in zip(wave, seqs, first):
            history[agent] = seq.prompt + tuple(seq.output)
            records.append(dict(agent=agent, turn=turn, prompt=len(seq.prompt),
                                reused=seq.reused, computed=len(seq.prompt) - seq.reused,
                                path=seq.reuse_path, ttft_s=ttft))
    return records


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def summary(records: list[dict]) -> dict:
    ttfts = [r["ttft_s"] for r in records]
    per_turn = []
    for turn in sorted({r["turn"] for r in records}):
        rows = [r for r in records if r["turn"] == turn]
        per_turn.append(dict(turn=turn + 1, ttft_p50_s=statistics.median(r["ttft_s"] for r in rows),
                             prompt=sum(r["prompt"] for r in rows),
                             reused=sum(r["reused"] for r in rows),
                             computed=sum(r["computed"] for r in rows),
                             paths=sorted({r["path"] for r in rows})))
    return dict(ttft_p50_s=statistics.median(ttfts), ttft_p99_s=pct(ttfts, 0.99),
                computed=sum(r["computed"] for r in records),
                prompt=sum(r["prompt"] for r in records),
                hits=sum(r["reused"] > 0 for r in records), requests=len(records),
                per_turn=per_turn)


def markdown(result: dict) -> str:
    a = result["args"]
    lines = [f"# Agent replay: {a['agents']} conversations x {a['turns']} turns, a shared "
             f"{a['system']}-token system prompt", "",
             f"- machine: {result['machine']}", f"- command: `{result['command']}`, "
             f"{result['date']}", f"- model: {result['model']}; {a['user']} new tokens a turn, "
             f"{a['answer']}-token answers, {a['concurrency']} at a time, device pool of "
             f"{a['device_conversations']} final-length conversations", "",
             "| mode | TTFT p50 | TTFT p99 | requests with a hit | computed prefill | "
             "of cache off | host pages restored |", "|---|---|---|---|---|---|---|"]
    off = result["modes"]["cache off"]["computed"]
    for mode, s in result["modes"].items():
        lines.append(f"| {mode} | {s['ttft_p50_s'] * 1e3:.0f} ms | {s['ttft_p99_s'] * 1e3:.0f} ms"
                     f" | {s['hits']} / {s['requests']} | {s['computed']} of {s['prompt']} | "
                     f"{100 * s['computed'] / off:.1f} % | {s['host_pages_restored']} |")
    lines += ["", "Per turn (TTFT p50 over the agents; prompt tokens restored / computed; reuse "
              "paths):", "", "| turn | " + " | ".join(result["modes"]) + " |",
              "|---|" + "---|" * len(result["modes"])]
    turns = zip(*(s["per_turn"] for s in result["modes"].values()))
    for rows in turns:
        cells = [f"{r['ttft_p50_s'] * 1e3:.0f} ms, {r['reused']} / {r['computed']} "
                 f"({', '.join(r['paths'])})" for r in rows]
        lines.append(f"| {rows[0]['turn']} | " + " | ".join(cells) + " |")
    if result.get("note"):
        lines += ["", result["note"]]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="artifact (default: the default model)")
    parser.add_argument("--arch", default=None, help="a synthesized shape on CUDA instead")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--weights", default="fp8-row")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--system", type=int, default=12288)
    parser.add_argument("--user", type=int, default=512)
    parser.add_argument("--answer", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--device-conversations", type=int, default=4)
    parser.add_argument("--host-kv-mib", type=int, default=4096)
    parser.add_argument("--chunk", type=int, default=None, help="--prefill-chunk")
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.cuda = args.arch is not None
    if args.cuda and not torch.cuda.is_available():
        print("agent_replay: --arch needs a CUDA device", file=sys.stderr)
        return 1
    parts = synthetic(args) if args.cuda else None
    modes, model_name = {}, None
    for mode in MODES:
        engine = build(args, mode, parts)
        vocab = engine.tokenizer.vocab_size if parts is None else parts[1].config("text")[
            "vocab_size"]
        model_name = model_name or (args.arch and f"synthetic {args.arch}, {args.layers} layers, "
                                    f"{args.weights}") or str(engine.config.artifact.name)
        modes[mode] = summary(replay(engine, args, vocab))
        modes[mode]["host_pages_restored"] = engine.snapshot().prefix.host_restored_pages
        del engine
    machine = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}" if args.cuda
               else ", ".join(f"{k} {v}" for k, v in cpu_machine().items()))
    result = dict(machine=machine, command="python " + " ".join(sys.argv),
                  date=datetime.now(timezone.utc).isoformat(), model=model_name,
                  args={k: v for k, v in vars(args).items() if k != "out"}, modes=modes,
                  note=args.note)
    result["args"]["out"] = str(args.out)
    write_report(args.out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
