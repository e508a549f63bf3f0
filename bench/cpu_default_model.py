"""Decode speed and time to first token of the default model on this CPU, beside llama.cpp.

    .venv/bin/python bench/cpu_default_model.py [--runs 5] [--peer]

Runs the engine in-process (no HTTP): a ~100-token chat prompt, 128 greedy output tokens (EOS
ignored so every run decodes the same count), median over runs after one warm-up. The default
engine (`--cpu-step compiled`) and, with `--peer` and `llama-cpp-python` importable, llama.cpp
on the same GGUF, prompt and token count (in a child process: its threads never share torch's
OpenMP runtime), are loaded side by side and measured run by run in turn (ours, then the peer),
so a change in the machine's load hits both alike.
Then: the default engine's aggregate decode with 8 requests at once against the same 8 one
after another (`bench/concurrency.py`'s measure); the eager step (`--cpu-step eager`) with fp32,
bf16 and int8 projections for reference; and the bandwidth roofline of a default decode step
(the bytes it reads: the stored Q8 weights, K/V at the mean context; over the memory
bandwidth measured here). The CPU other processes used during each part is recorded
(`ForeignLoad`): another busy process on a 2-core box halves torch's 2-thread speed or worse.
Writes bench/results/cpu-default-model.{json,md}.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import ForeignLoad, cpu_machine, write_report  # noqa: E402
from ninfer_engine.cli.flags import default_artifact, ninfer_home  # noqa: E402

PROMPT = (
    "You are reviewing a short report about renewable energy. Summarise, in plain words, why "
    "solar panels produce less electricity in winter than in summer, mention the role of the "
    "angle of the sun, the length of the day and the weather, and finish with one practical "
    "tip for a family that wants to use more of its own solar power during the darker months "
    "of the year."
)
PUBLISHED_PEER = {"name": "llama.cpp (llama-cpp-python 0.3.36, 2 threads)", "decode_tok_s": 70.7,
                  "ttft_s": 0.47, "source": "perf-anchors.md §8, same machine type"}


async def run_ninfer(engine, prompt_ids: list[int], output_tokens: int) -> tuple[float, float]:
    from ninfer_engine.types import GenerationRequest, SamplingParams

    request = GenerationRequest(request_id=f"bench-{time.monotonic_ns()}",
                                prompt_ids=tuple(prompt_ids), max_tokens=output_tokens,
                                sampling=SamplingParams(temperature=0.0), ignore_eos=True)
    start = time.perf_counter()
    first = last = None
    count = 0
    async for event in engine.submit(request):
        if event.token_ids:
            now = time.perf_counter()
            first = first or now
            last = now
            count += len(event.token_ids)
        if event.error:
            raise RuntimeError(event.error.message)
    assert count == output_tokens, f"generated {count} tokens, expected {output_tokens}"
    return first - start, (count - 1) / (last - first)


def _engine(artifact: Path, **flags):
    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine

    started = time.perf_counter()
    engine = Engine(EngineConfig(artifact=artifact, max_context=2048, **flags))
    engine.start()
    return engine, time.perf_counter() - started


def _summary(results: list[tuple[float, float]], **fields) -> dict:
    return {**fields, "ttft_s": statistics.median(r[0] for r in results),
            "decode_tok_s": statistics.median(r[1] for r in results),
            "runs": [{"ttft_s": t, "decode_tok_s": d} for t, d in results]}


def _prompt_ids(engine) -> list[int]:
    return engine.tokenizer.encode(engine.chat_template.render(
        [{"role": "user", "content": PROMPT}]))


def _peer_run(llm, output_tokens: int) -> tuple[float, float]:
    llm.reset()
    start = time.perf_counter()
    first = last = None
    count = 0
    for _ in llm.create_chat_completion([{"role": "user", "content": PROMPT}],
                                        max_tokens=output_tokens, temperature=0.0, stream=True):
        now = time.perf_counter()
        first = first or now
        last = now
        count += 1
    return first - start, (count - 2) / (last - first)  # the first chunk carries no token


def _peer_serve(conn, gguf: str, threads: int) -> None:
    """The peer's process: loads llama.cpp, then runs one generation per token count it gets."""
    from llama_cpp import Llama

    llm = Llama(model_path=gguf, n_ctx=2048, n_threads=threads, verbose=False)
    conn.send("ready")
    while (tokens := conn.recv()) is not None:
        before = os.times()
        ttft, rate = _peer_run(llm, tokens)
        after = os.times()
        conn.send((ttft, rate, after.user + after.system - before.user - before.system))


class Peer:
    """llama.cpp in a process of its own (its thread pool and OpenMP runtime never share this
    process's with torch's: two teams in one process make each wait on futex wake-ups), run
    one generation at a time on request."""

    def __init__(self, gguf: Path, threads: int) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_peer_serve, args=(child, str(gguf), threads),
                                 daemon=True)
        self._proc.start()
        if self._conn.recv() != "ready":
            raise RuntimeError("llama.cpp did not load")

    def run(self, output_tokens: int) -> tuple[float, float, float]:
        """(time to first token, decode tok/s, CPU seconds the peer's process used)."""
        self._conn.send(output_tokens)
        return self._conn.recv()

    def close(self) -> None:
        self._conn.send(None)
        self._proc.join(30)


SETTLE_S = 0.5  # between the two engines' runs: the other's idle threads stop spinning


def bench_side_by_side(artifact: Path, runs: int, output_tokens: int, gguf: Path | None,
                       threads: int) -> tuple[dict, dict | None, dict]:
    """The default engine and llama.cpp (when `gguf`), run by run in turn; then the default
    engine's concurrency-8 aggregate against serial. Returns (ours, peer, concurrency)."""
    from bench.concurrency import _serial, _together

    engine, load_s = _engine(artifact, max_concurrency=8, no_prefix_reuse=True)
    llm = Peer(gguf, threads) if gguf is not None else None
    prompt_ids = _prompt_ids(engine)
    ours, peer, ours_load, peer_load = [], [], [], []
    try:
        asyncio.run(run_ninfer(engine, prompt_ids, 8))  # warm-up
        if llm is not None:
            llm.run(8)  # warm-up
        for _ in range(runs):
            time.sleep(SETTLE_S)
            with ForeignLoad() as load:
                ours.append(asyncio.run(run_ninfer(engine, prompt_ids, output_tokens)))
            ours_load.append(load.cores or 0.0)
            if llm is not None:
                time.sleep(SETTLE_S)
                started = time.perf_counter()
                with ForeignLoad() as load:
                    ttft, rate, cpu_s = llm.run(output_tokens)
                peer.append((ttft, rate))
                # the peer's own process is not foreign load
                wall = time.perf_counter() - started
                peer_load.append(max(0.0, (load.cores or 0.0) - cpu_s / wall))
        prompts = [engine.tokenizer.encode(engine.chat_template.render(
            [{"role": "user", "content": f"Request {i + 1}. {PROMPT}"}])) for i in range(8)]
        with ForeignLoad() as load:
            serial = asyncio.run(_serial(engine, prompts, 64))
            together = asyncio.run(_together(engine, prompts, 64))
    finally:
        engine.stop()
        if llm is not None:
            llm.close()
    decoder = engine.runner.graphs.decoder if engine.runner.graphs else None
    mine = _summary(ours, cpu_step="compiled" if decoder else "eager", load_s=load_s,
                    prompt_tokens=len(prompt_ids), output_tokens=output_tokens,
                    foreign_load_cores=statistics.mean(ours_load), step_bytes=_step_bytes(
                        engine.model, decoder, len(prompt_ids) + output_tokens // 2))
    theirs = None if not peer else _summary(
        peer, name="llama.cpp via llama-cpp-python, measured in this run, run by run in turn",
        foreign_load_cores=statistics.mean(peer_load))
    concurrency = {"serial_decode_tok_s": serial[0], "concurrency_8_decode_tok_s": together[0],
                   "ratio": together[0] / serial[0], "output_tokens": 64,
                   "foreign_load_cores": load.cores or 0.0}
    return mine, theirs, concurrency


def bench_eager(artifact: Path, runs: int, output_tokens: int, cpu_matmul: str) -> dict:
    engine, load_s = _engine(artifact, cpu_step="eager", cpu_matmul=cpu_matmul,
                             no_prefix_reuse=True)
    prompt_ids = _prompt_ids(engine)
    try:
        asyncio.run(run_ninfer(engine, prompt_ids, 8))  # warm-up
        with ForeignLoad() as load:
            results = [asyncio.run(run_ninfer(engine, prompt_ids, output_tokens))
                       for _ in range(runs)]
    finally:
        engine.stop()
    return _summary(results, cpu_matmul=cpu_matmul, cpu_step="eager", load_s=load_s,
                    prompt_tokens=len(prompt_ids), output_tokens=output_tokens,
                    foreign_load_cores=load.cores)


def _step_bytes(model, decoder, context: int) -> int:
    """Bytes one batch-1 decode step reads: the weights it multiplies by (the stored Q8 rows,
    padding included, and their scales; fp32 on the eager step) and K/V of `context` tokens."""
    layers, heads, dim = model.kv_layout()
    kv = 2 * layers * context * heads * dim * 4
    if decoder is None:
        return model.weight_bytes() + kv
    matrices, head = decoder._keep
    q8 = sum(m.codes.nbytes + m.scales.nbytes for layer in matrices for m in layer.values())
    return q8 + head.codes.nbytes + head.scales.nbytes + kv


def memory_bandwidth(threads: int) -> float:
    """Bytes/s of the best of 5 fp32 sums over 256 MiB (far past the last-level cache)."""
    import torch

    torch.set_num_threads(threads)
    data = torch.ones(64 << 20)
    data.sum()
    best = min(_timed(data.sum) for _ in range(5))
    return data.nbytes / best


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, default=default_artifact())
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--peer", action="store_true", help="also run llama.cpp on the GGUF")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "bench" / "results" / "cpu-default-model")
    args = parser.parse_args()
    import torch

    threads = torch.get_num_threads()
    gguf = ninfer_home() / "downloads" / "SmolLM2-135M-Instruct.Q4_1.gguf" if args.peer else None
    ours, measured_peer, concurrency = bench_side_by_side(args.artifact, args.runs,
                                                          args.output_tokens, gguf, threads)
    eager = {m: bench_eager(args.artifact, args.runs, args.output_tokens, m)
             for m in ("fp32", "bf16", "int8")}
    peer = measured_peer or dict(PUBLISHED_PEER)
    bandwidth = memory_bandwidth(threads)
    result = {
        "benchmark": "cpu-default-model",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python bench/cpu_default_model.py " + " ".join(sys.argv[1:]),
        "machine": cpu_machine(),
        "model": args.artifact.name,
        "ninfer": ours,
        "ninfer_eager": eager["fp32"],
        "ninfer_bf16": eager["bf16"],
        "ninfer_int8": eager["int8"],
        "peer": peer,
        "concurrency": concurrency,
        "roofline": {"bandwidth_gb_s": bandwidth / 1e9, "step_bytes": ours["step_bytes"],
                     "decode_tok_s": bandwidth / ours["step_bytes"]},
        "ratio_decode": ours["decode_tok_s"] / peer["decode_tok_s"],
        "ratio_ttft": ours["ttft_s"] / peer["ttft_s"],
        **{f"ratio_decode_{k}": e["decode_tok_s"] / peer["decode_tok_s"]
           for k, e in (("eager", eager["fp32"]), ("bf16", eager["bf16"]),
                        ("int8", eager["int8"]))},
        **{f"ratio_ttft_{k}": e["ttft_s"] / peer["ttft_s"]
           for k, e in (("eager", eager["fp32"]), ("bf16", eager["bf16"]),
                        ("int8", eager["int8"]))},
    }
    write_report(args.out, result, markdown)
    return 0


def _tok_s(e: dict) -> str:
    """Median decode tok/s and the range over the runs (this box's speed drifts by ±15 %)."""
    runs = [x["decode_tok_s"] for x in e["runs"]]
    return f"{e['decode_tok_s']:.1f} ({min(runs):.1f}-{max(runs):.1f})"


def _load(cores: float | None) -> str:
    return f"{cores or 0.0:.2f}"


def markdown(r: dict) -> str:
    m, o, p, c, roof = r["machine"], r["ninfer"], r["peer"], r["concurrency"], r["roofline"]
    eager = [("`--cpu-step eager` (fp32)", r["ninfer_eager"], "eager"),
             ("`--cpu-step eager --cpu-matmul bf16`", r["ninfer_bf16"], "bf16"),
             ("`--cpu-step eager --cpu-matmul int8`", r["ninfer_int8"], "int8")]
    loads = [o["foreign_load_cores"], p.get("foreign_load_cores"),
             *(e["foreign_load_cores"] for _, e, _ in eager), c["foreign_load_cores"]]
    peer_runs = _tok_s(p) if "runs" in p else f"{p['decode_tok_s']:.1f}"
    return (
        f"# Default model on the CPU ({r['date'][:10]})\n\n"
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']} ({m['torch_threads']} "
        f"threads). Command: `{r['command']}`. Model: {r['model']}, {o['prompt_tokens']} prompt "
        f"tokens, {o['output_tokens']} greedy output tokens, median of {len(o['runs'])} runs. "
        "The default engine and llama.cpp were loaded side by side and run in turn.\n\n"
        "| engine | decode tok/s (runs' range) | time to first token | other processes' CPU |\n"
        "|---|---:|---:|---:|\n"
        f"| ninfer default (`--cpu-step {o['cpu_step']}`) | {_tok_s(o)} | "
        f"{o['ttft_s'] * 1000:.0f} ms | {_load(o['foreign_load_cores'])} |\n"
        f"| {p['name']} | {peer_runs} | {p['ttft_s'] * 1000:.0f} ms | "
        f"{_load(p.get('foreign_load_cores'))} |\n"
        + "".join(f"| ninfer {label} | {_tok_s(e)} | {e['ttft_s'] * 1000:.0f} ms | "
                  f"{_load(e['foreign_load_cores'])} |\n" for label, e, _ in eager)
        + f"| ratio ninfer default / peer | {r['ratio_decode']:.2f} | {r['ratio_ttft']:.2f} | |\n"
        + "".join(f"| ratio ninfer {label} / peer | {r[f'ratio_decode_{k}']:.2f} | "
                  f"{r[f'ratio_ttft_{k}']:.2f} | |\n" for label, _, k in eager)
        + f"\nDefault engine: loaded in {o['load_s']:.1f} s (its C step compiled once per "
        f"machine into $NINFER_HOME/kernels, then loaded from there). Bandwidth roofline: a "
        f"decode step reads {o['step_bytes'] / 1e6:.0f} MB (weights as multiplied, K/V at the "
        f"mean context); at the {roof['bandwidth_gb_s']:.1f} GB/s measured here that is "
        f"{roof['decode_tok_s']:.0f} tok/s, the default reaches "
        f"{o['decode_tok_s'] / roof['decode_tok_s']:.0%} of it.\n\n"
        f"Concurrency (default engine, 8 prompts of ~110 tokens, {c['output_tokens']} tokens "
        f"each): aggregate decode {c['concurrency_8_decode_tok_s']:.1f} tok/s with the 8 at "
        f"once against {c['serial_decode_tok_s']:.1f} one after another: {c['ratio']:.2f}x.\n\n"
        "CPU used by other processes during the runs (cores; the table's column, then the "
        "concurrency runs: " + _load(c["foreign_load_cores"]) + "): "
        + ("quiet" if max(x or 0.0 for x in loads) < 0.25
           else "another process was busy: those numbers are low") + ".\n"
    )


if __name__ == "__main__":
    sys.exit(main())
