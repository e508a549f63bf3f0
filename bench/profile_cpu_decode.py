"""Where one CPU decode step of the default model spends its time: ops by total, and a split.

    .venv/bin/python bench/profile_cpu_decode.py [--cpu-matmul fp32|bf16|int8] [--context 128]

Loads the engine's model and paged KV pool (`Engine`, not started), prefills `--context`
tokens, times `--steps` batch-1 decode forwards (`LlamaModel.forward`, sampling and the step
loop excluded), then the same steps with every projection and the head replaced by a
preallocated output (what the step costs besides its matmuls: norms, rope, attention, KV
reads/writes, Python and dispatch), then profiles a few real steps with torch.profiler and
prints the CPU ops by self time and the profiled step split by projection kind.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ninfer_engine.config import EngineConfig  # noqa: E402
from ninfer_engine.cli.flags import default_artifact  # noqa: E402
from ninfer_engine.models import Segment  # noqa: E402
from ninfer_engine.models.layers import Linear  # noqa: E402

MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::matmul", "aten::linear", "aten::mv",
              "aten::_weight_int8pack_mm", "aten::bmm"}


def _label_linears(model) -> None:
    """Wrap each `Linear` call in a `record_function` named after its kind (qkv, head, ...)."""
    def wrap(linear: Linear, name: str) -> None:
        call = linear.__call__

        class Named(type(linear)):
            def __call__(self, x):
                with record_function(f"proj::{name}"):
                    return call(x)
        linear.__class__ = Named

    wrap(model.head, "head")
    for layer in model.layers:
        for name in ("qkv", "output", "gate_up", "down"):
            wrap(getattr(layer, name), name)


class _NoMatmul:
    """Stands in for a `Linear`: returns a preallocated output of the right width."""

    def __init__(self, linear: Linear) -> None:
        width = linear.weight.shape[1] if linear.k_major else linear.weight.shape[0]
        self.out = torch.zeros(1, width)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.out.expand(x.shape[0], -1).clone()


def _without_matmuls(model):
    """A shallow copy of `model` whose projections and head are `_NoMatmul`s."""
    import copy

    bare = copy.copy(model)
    bare.head = _NoMatmul(model.head)
    bare.layers = [copy.copy(layer) for layer in model.layers]
    for layer in bare.layers:
        for name in ("qkv", "output", "gate_up", "down"):
            setattr(layer, name, _NoMatmul(getattr(layer, name)))
    return bare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--artifact", type=Path, default=default_artifact())
    ap.add_argument("--cpu-matmul", default="fp32")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    from ninfer_engine.engine import Engine

    engine = Engine(EngineConfig(artifact=args.artifact, max_context=2048,
                                 cpu_matmul=args.cpu_matmul))
    model = engine.model
    cache = engine.memory.storage.new_cache()
    with torch.inference_mode():
        ids = list(range(1000, 1000 + args.context))
        model.forward(torch.tensor(ids), torch.arange(len(ids)), [Segment(cache, 0, len(ids))],
                      torch.tensor([len(ids) - 1]))
        pos = [len(ids)]

        def step(net=model):
            p = pos[0]
            logits = net.forward(torch.tensor([17]), torch.tensor([p]), [Segment(cache, p, 1)],
                                 torch.tensor([0]))
            pos[0] += 1
            return logits

        def timed(net) -> float:
            for _ in range(5):
                step(net)
            start = time.perf_counter()
            for _ in range(args.steps):
                step(net)
            return (time.perf_counter() - start) / args.steps * 1e3

        step_ms = timed(model)
        rest_ms = timed(_without_matmuls(model))
        _label_linears(model)
        n = 10
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for _ in range(n):
                step()
            profiled_ms = (time.perf_counter() - start) / n * 1e3
    print(f"cpu-matmul {args.cpu_matmul}: decode step {step_ms:.1f} ms ({1e3 / step_ms:.1f} "
          f"tok/s) at context {args.context}: matmuls {step_ms - rest_ms:.1f} ms, the rest "
          f"{rest_ms:.1f} ms (norms, rope, attention, KV, Python); {profiled_ms:.1f} ms under "
          "the profiler")
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=40))
    split = defaultdict(float)
    for e in events:
        if e.key.startswith("proj::"):
            split[e.key] += e.cpu_time_total / n / 1e3
        elif e.key == "aten::scaled_dot_product_attention":
            split["attention (sdpa)"] += e.cpu_time_total / n / 1e3
        elif e.key in ("aten::index", "aten::index_put_", "aten::index_select"):
            split["kv write/read + gathers"] += e.self_cpu_time_total / n / 1e3
        elif e.key == "aten::rms_norm":
            split["rms_norm"] += e.cpu_time_total / n / 1e3
    for key, ms in sorted(split.items(), key=lambda kv: -kv[1]):
        print(f"  {key:28s} {ms:7.2f} ms  {ms / profiled_ms:5.1%}")
    ops = sum(e.self_cpu_time_total for e in events if e.key.startswith("aten::")) / n / 1e3
    print(f"  {'all aten ops (self)':28s} {ops:7.2f} ms  {ops / profiled_ms:5.1%}; the rest "
          f"{profiled_ms - ops:.2f} ms is Python and dispatch between ops")


if __name__ == "__main__":
    main()
