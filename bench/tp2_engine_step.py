"""`--tp 2` on two GPUs (`nvidia-h200-x2`): the serving engine's decode step over NCCL, and the
all-reduce it pays per layer.

Two processes (one a GPU, NCCL, env:// on 127.0.0.1). Each draws the synthetic model (the same
seeded draws as `ninfer bench`) and keeps its share (`parallel.shard`, routed experts by
intermediate); rank 0 serves it with `Engine` (ranks in lockstep, CUDA graphs with the NCCL
all-reduces inside) and times `Engine.step` at B = 1 and B = 8 decode, rank 1 is a `Follower`.
Before that both ranks time `all_reduce` of decode-sized fp32 [B, H] messages, eagerly and
inside a CUDA graph of 64 of them (the issue's target: <= 10 µs a reduce). Compare with tp1 from
`bench/tp_rank_step.py` (same shapes, same engine) or bench/results/h200-ninfer-bench-*.md.

    python bench/tp2_engine_step.py --out DIR [--shapes 27b:bf16,35b-a3b:fp8-row]

Writes DIR/tp2-engine-step.json. `--device cpu --shapes tiny-dense:bf16` runs it over gloo
(the smoke run of the script; no graphs).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from ninfer_engine.artifact.synth import synth_config  # noqa: E402
from ninfer_engine.benchmark.engine_step import SyntheticResources  # noqa: E402
from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.engine import Engine  # noqa: E402
from ninfer_engine.parallel import join_from_env, leave  # noqa: E402
from ninfer_engine.parallel.follower import Follower  # noqa: E402
from tp_rank_step import CONTEXT, _decode_ms, _model  # noqa: E402

REPS = 64


def _allreduce_us(hidden: int, batch: int, device: torch.device, graph: bool) -> float:
    """Mean µs of one in-place all_reduce of fp32 [batch, hidden]."""
    x = torch.ones(batch, hidden, device=device)
    for _ in range(8):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    if graph and device.type == "cuda":
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(REPS):
                dist.all_reduce(x)
        g.replay()
        torch.cuda.synchronize()
        start = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
    else:
        start = time.perf_counter()
        for _ in range(REPS):
            dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / REPS


def _rank(rank: int, port: int, shapes: list[str], device_kind: str, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2")
    device = torch.device(f"cuda:{rank}" if device_kind == "cuda" else "cpu")
    ranks = join_from_env(device)
    for shape in shapes:
        arch, weights = shape.split(":")
        config, model = _model(arch, weights, device_kind, ranks, None)  # the rank's device
        row = {"allreduce_us": {f"B={b}, {'graph' if g else 'eager'}":
                                _allreduce_us(config["hidden_size"], b, device, g)
                                for b in (1, 8)
                                for g in ((False, True) if device.type == "cuda" else (False,))}}
        engine_config = EngineConfig(
            artifact=Path(f"synth-{arch}"), tp=2, devices=(0, 1), device=rank,
            max_concurrency=8, max_context=CONTEXT + 256, kv_capacity=8 * (CONTEXT + 256),
            no_prefix_reuse=True)
        resources = SyntheticResources(arch, synth_config(arch))  # the whole model's config
        if rank:
            Follower(engine_config, resources, ranks, model).run()
            continue
        engine = Engine(engine_config, resources, model=model, ranks=ranks)
        row["graphs"] = engine.runner.graphs is not None
        row["step_ms"] = {b: _decode_ms(engine, b, config["vocab_size"]) for b in (1, 8)}
        row["tok_s_b1"] = 1e3 / row["step_ms"][1]
        engine.stop()
        results.put((shape, row))
    leave()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--shapes", default="27b:bf16,35b-a3b:fp8-row")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.device == "cuda" and torch.cuda.device_count() < 2:
        print("tp2_engine_step needs two CUDA devices", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    shapes = args.shapes.split(",")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, shapes, args.device, results))
             for r in range(2)]
    for p in procs:
        p.start()
    out = {"command": " ".join(sys.argv), "shapes": {}}
    try:
        for _ in shapes:
            shape, row = results.get(timeout=540)
            out["shapes"][shape] = row
            print(shape, row, file=sys.stderr)
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        (args.out / "tp2-engine-step.json").write_text(json.dumps(out, indent=1))
    return 0 if len(out["shapes"]) == len(shapes) else 1


if __name__ == "__main__":
    sys.exit(main())
