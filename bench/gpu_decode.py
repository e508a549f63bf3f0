"""Batch-1 decode step time of Qwen3.5-shape hybrid stacks with random bf16 weights, one GPU.

    python3 bench/gpu_decode.py [--out bench/results/h200-decode.json] [--layers 64] [--moe]

Builds the 27B-shape dense stack (64 layers, 48 GDN + 16 gated attention, H 5120) directly in
device memory, fills the per-sequence state to 4K and 32K tokens with random KV and GDN state,
and times one decode step of:
* `Qwen35Model`, the torch reference path, eager and as a replayed CUDA graph;
* `KernelDecoder` (ninfer_engine/benchmark/decode.py), the same weights on the ninfer kernels
  with static paged KV, eager and as a CUDA graph replayed as real greedy decode; bf16 cuBLAS
  matmuls, and fp8-row weights through the dequant GEMV.
Each step is checked against the reference model's logits. The roofline is perf-anchors §6:
(weights read + 2 × GDN state + KV at that context) / the copy bandwidth measured here.
With --moe the same for the 35B-A3B-shape stack (40 layers, 256 experts, top-8), whose reference
routing syncs with the host, so only its eager step is timed; its kernel path is bf16 only.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from decode_stack import RandomParams  # noqa: E402
from gpu_kernels import copy_bandwidth  # noqa: E402

from ninfer_engine.benchmark.decode import KernelDecoder  # noqa: E402
from ninfer_engine.benchmark.timing import time_ms  # noqa: E402
from ninfer_engine.models.gdn import GDNState  # noqa: E402
from ninfer_engine.models.qwen3_5 import Qwen35Model  # noqa: E402

ROPE = {"rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]}
COMMON = dict(head_dim=256, linear_num_key_heads=16, linear_key_head_dim=128,
              linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
              vocab_size=248320, tie_word_embeddings=False, rope_parameters=ROPE)
DENSE_27B = dict(COMMON, hidden_size=5120, num_hidden_layers=64, num_attention_heads=24,
                 num_key_value_heads=4, linear_num_value_heads=48, intermediate_size=17408)
MOE_35B = dict(COMMON, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
               num_key_value_heads=2, linear_num_value_heads=32, intermediate_size=512,
               num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
               shared_expert_intermediate_size=512, norm_topk_prob=True)
TOKEN = 1234


def with_layers(config, n):
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    return dict(config, num_hidden_layers=n, layer_types=layer_types)


def build(config):
    params = RandomParams(config)
    model = Qwen35Model(config, params)
    rope = next(b.mixer.rope for b in model.blocks if hasattr(b.mixer, "rope"))
    rope.inv_freq = rope.inv_freq.cuda()  # a CPU table would force a copy inside graph capture
    return model, params


def random_state(model, ctx):
    """A sequence state as if `ctx` tokens had been consumed: random KV and GDN state."""
    state = model.new_state()
    for s in state.layers:
        if isinstance(s, GDNState):
            s.conv.normal_()
            s.ssm.normal_(std=0.1)
        else:
            s.k = torch.randn(s.k.shape[0], ctx, s.k.shape[2], device="cuda", dtype=s.k.dtype)
            s.v = torch.randn_like(s.k)
    state.seen = ctx
    return state


def state_bytes(model, ctx):
    """GDN SSM state read + written, conv state, and the KV read at context `ctx`."""
    n = 0
    for b in model.blocks:
        m = b.mixer
        if hasattr(m, "nv"):
            n += 2 * m.nv * m.dk * m.dv * 4 + 2 * (m.taps - 1) * m.conv_dim * 2
        else:
            n += 2 * ctx * m.nkv * m.d * 2
    return n


def graph_of(fn, warm=None):
    """Capture `fn` after warming `warm` (default `fn`) up on a side stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            (warm or fn)()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def bench_reference(model, state, tok, ref, rows, label, capture=True):
    """Eager and (if `capture`) graph-replayed reference step; the first replay is checked.

    Eager steps run on one copy of the state, so its context grows by one token per step; the
    captured graph replays the step at exactly `ctx` each time.
    """
    running = copy.deepcopy(state)
    eager = time_ms(lambda: model.forward(tok, running, last_only=True), 3)
    rows.append(dict(path="reference eager", **label, step_ms=eager, tok_s=1e3 / eager))
    if not capture:
        return
    g_state = copy.deepcopy(state)
    graph, out = graph_of(lambda: model.forward(tok, g_state, last_only=True),
                          warm=lambda: model.forward(tok, copy.deepcopy(state), last_only=True))
    graph.replay()
    err = rel(out, ref)
    ms = time_ms(graph.replay, 10)
    rows.append(dict(path="reference cuda-graph", **label, step_ms=ms, tok_s=1e3 / ms,
                     logits_rel_err_vs_eager=err))


def bench_kernels(dec, state, tok, ref, rows, label, name):
    dec.load_state(state)
    dec.token.fill_(TOKEN)
    logits = dec.step(dec.token)
    err, same = rel(logits, ref), bool(logits.argmax() == ref.argmax())
    eager = time_ms(dec.greedy_step, 3)
    graph, _ = graph_of(dec.greedy_step)
    ms = time_ms(graph.replay, 30)
    for path, t in ((f"{name} eager", eager), (f"{name} cuda-graph", ms)):
        rows.append(dict(path=path, **label, step_ms=t, tok_s=1e3 / t,
                         logits_rel_err_vs_reference=err, argmax_matches_reference=same))
    del graph


def bench_stack(args, bw, rows, save, config, label_name, moe):
    """One stack: reference and kernel paths at each context.

    The MoE reference routes through a host sync, so it is timed eager only; the kernel paths
    of a MoE stack run bf16 only (the routed-expert kernel has no fp8 variant).
    """
    ctxs = [int(c) for c in args.ctx.split(",")]
    model, params = build(config)
    tok = torch.tensor([TOKEN], device="cuda")
    variants = (("kernels bf16", False),) if moe else (("kernels bf16", False),
                                                       ("kernels fp8-row", True))
    decoders = {name: KernelDecoder(model, params, max(ctxs) + 256, fp8=fp8)
                for name, fp8 in variants}
    for ctx in ctxs:
        state = random_state(model, ctx)
        ref = model.forward(tok, copy.deepcopy(state), last_only=True)
        for name, dec in decoders.items():
            nbytes = dec.weight_bytes() + state_bytes(model, ctx)
            label = dict(model=label_name, layers=config["num_hidden_layers"], ctx=ctx,
                         weights=name[8:], bytes_per_step=nbytes,
                         roofline_tok_s=bw * 1e9 / nbytes)
            # one failing path is recorded and the others still run
            runs = []
            if name == "kernels bf16":
                runs.append(("reference", lambda: bench_reference(model, state, tok, ref, rows,
                                                                  label, capture=not moe)))
            runs.append((name, lambda: bench_kernels(dec, state, tok, ref, rows, label, name)))
            for path, run in runs:
                try:
                    run()
                except Exception as exc:
                    rows.append(dict(path=path, **label, error=repr(exc)[:500]))
                save()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench/results/h200-decode.json"))
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--ctx", default="4096,32768")
    ap.add_argument("--moe", action="store_true")
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"copy bandwidth {bw:.0f} GB/s", flush=True)
    rows: list[dict] = []
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(), copy_gbps=bw,
                date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                command="python3 bench/gpu_decode.py " + " ".join(sys.argv[1:]))
    out = Path(args.out)

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
        for r in rows[len(printed):]:
            print({k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()},
                  flush=True)
            printed.append(r)

    printed: list[dict] = []
    # each stack in its own call, so nothing of the 27B stack is alive when the 35B one is built
    bench_stack(args, bw, rows, save, with_layers(DENSE_27B, args.layers), "27B dense", False)
    if args.moe:
        gc.collect()
        torch.cuda.empty_cache()
        layers = 40 if args.layers == 64 else args.layers
        bench_stack(args, bw, rows, save, with_layers(MOE_35B, layers), "35B-A3B", True)


if __name__ == "__main__":
    main()
