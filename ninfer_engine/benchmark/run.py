"""`ninfer bench`: batch-1 decode tok/s of a random-weight model beside its bandwidth roofline.

The model is `build_synthetic(arch)` drawn directly in device memory (bf16; `fp8` also quantises
every dense matrix to fp8 rows for the dequant GEMV). At each context the decoder's state is
filled with random KV and GDN state as if that many tokens had been consumed, and one greedy
step is timed eager and as a replayed CUDA graph (real autoregressive decode: the position and
KV advance on the device). The roofline is perf-anchors §6: (weights read + 2 × fp32 GDN state
+ conv state + KV at that context) / the copy bandwidth measured in the same run.
"""

from __future__ import annotations

import platform
import sys
from datetime import datetime, timezone

import torch
import triton

from ..artifact.synth import build_synthetic
from ..models.qwen3_5 import Qwen35Model
from .decode import FusedParams, KernelDecoder
from .timing import copy_bandwidth_gbps, graph_of, time_ms

NOT_MEASURED = {"prefill": "not measured yet", "concurrency": "not measured yet"}
EAGER_STEPS, GRAPH_STEPS = 3, 30  # few eager steps: they are only the launch-bound contrast


def run_decode_bench(arch: str, contexts: list[int], dtype: str = "bf16",
                     layers: int | None = None, command: str = "") -> dict:
    """Build the model on the GPU, time decode at each context; returns the JSON-able result."""
    fp8 = dtype == "fp8"
    gbps = copy_bandwidth_gbps()
    _log(f"copy bandwidth {gbps:.0f} GB/s; building synthetic {arch} on the GPU")
    config, source = build_synthetic(arch, "cuda", torch.bfloat16, layers)
    params = FusedParams(config, source)
    model = Qwen35Model(config, params)
    rope = next(b.mixer.rope for b in model.blocks if hasattr(b.mixer, "rope"))
    rope.inv_freq = rope.inv_freq.cuda()  # a CPU table would force a copy inside graph capture
    # room for the context plus every warm-up, eager and replayed step
    decoder = KernelDecoder(model, params, max(contexts) + 64, fp8=fp8)
    weights = decoder.weight_bytes()
    rows = []
    for ctx in contexts:
        decoder.fill_random(ctx)
        eager = time_ms(decoder.greedy_step, EAGER_STEPS)
        graph = graph_of(decoder.greedy_step)
        step = time_ms(graph.replay, GRAPH_STEPS)
        del graph
        nbytes = weights + decoder.state_bytes(ctx)
        roofline = gbps * 1e9 / nbytes
        rows.append(dict(context=ctx, graph_step_ms=step, tok_s=1e3 / step, eager_step_ms=eager,
                         eager_tok_s=1e3 / eager, bytes_per_step=nbytes, roofline_tok_s=roofline,
                         fraction_of_roofline=1e3 / step / roofline))
        _log(f"context {ctx}: {1e3 / step:.1f} tok/s (roofline {roofline:.0f})")
    return dict(
        machine=dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                     triton=triton.__version__, python=platform.python_version(),
                     copy_gbps=gbps),
        command=command, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        arch=arch, layers=config["num_hidden_layers"], dtype=dtype, batch=1,
        weights="random (synthetic, drawn on the GPU)", weight_bytes_per_step=weights,
        decode=rows, not_measured=NOT_MEASURED)


def markdown(result: dict) -> str:
    """The result as a short markdown report with one table row per context."""
    m = result["machine"]
    lines = [
        f"# ninfer bench: {result['arch']} ({result['layers']} layers), {result['dtype']}, "
        "batch-1 decode",
        "",
        f"- machine: {m['device']}, torch {m['torch']}, Triton {m['triton']}, "
        f"Python {m['python']}; copy bandwidth {m['copy_gbps']:.0f} GB/s",
        f"- command: `{result['command']}`, {result['date']}",
        f"- weights: {result['weights']}; {result['weight_bytes_per_step'] / 1e9:.2f} GB read "
        "per step",
        "",
        "| context | tok/s (CUDA graph) | step ms | eager tok/s | bytes/step | roofline tok/s "
        "| % of roofline |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["decode"]:
        lines.append(
            f"| {r['context']} | {r['tok_s']:.1f} | {r['graph_step_ms']:.2f} "
            f"| {r['eager_tok_s']:.1f} | {r['bytes_per_step'] / 1e9:.2f} GB "
            f"| {r['roofline_tok_s']:.0f} | {100 * r['fraction_of_roofline']:.0f} % |")
    lines += ["", "Not measured yet: " + ", ".join(result["not_measured"]) + "."]
    return "\n".join(lines) + "\n"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
