"""`ninfer bench`: decode, aggregate decode and prefill of a random-weight model on the GPU, each
beside its roofline, and the same shapes through transformers as the peer.

The model is `build_synthetic(arch)` drawn directly in device memory in bf16; with a storage
recipe other than bf16 (`--weights`, the recipes of `ninfer convert`) each projection the recipe
stores packed is encoded on the GPU and served as the engine's `--cuda-weights` (auto or packed)
serves a converted artifact, routed experts included (fp8-row experts as stored, Q4/Q5 ones as
fp8 groups under packed or when bf16 would not fit, others bf16: `models.experts`). Before
anything is drawn, `ninfer bench` checks the planned bytes against free memory
(`footprint.refusal`). Sections of the result:

- `decode`: batch-1 greedy steps at each context, eager and as a replayed CUDA graph (real
  autoregressive decode: the position and KV advance on the device), with the decoder's state
  filled with random KV and GDN state as if that many tokens had been consumed.
- `concurrency`: B sequences decoded in one graph-replayed step (`KernelDecoder(batch=B)`), each at
  `concurrency_context`; aggregate tok/s = B / step time.
- `prefill`: the torch reference `Qwen35Model.forward` (bf16 cuBLAS matmuls, eager) over a
  random prompt in chunks of `prefill_chunk` tokens (the engine's default chunk), from an empty
  state; one warm-up over the first two chunks, then timed full passes by CUDA events.
- `peer`: transformers' batch-1 prefill and greedy decode of the same config (`peer.run_peer`),
  built after our model is freed so both fit in device memory.

Rooflines (see `roofline`): bandwidth = tokens × copy bandwidth / bytes touched per step (weights
read once, routed experts for min(E, B·top_k) per layer, + each sequence's 2 × fp32 GDN state,
conv state and KV); compute = tokens × matmul rate / FLOPs (2 × active matmul params per token
+ attention); both rates measured in the same run; the roofline is the lower of the two.
"""

from __future__ import annotations

import gc
import platform
import sys
from datetime import datetime, timezone

import torch
import triton

from ..artifact.synth import build_synthetic
from ..models.experts import bf16_fits, free_device_bytes
from ..models.packed import DENSE
from ..models.qwen3_5 import Qwen35Model
from . import roofline as rf
from .footprint import packed_source
from ..models.fused import FusedParams
from .decode import KernelDecoder
from .timing import copy_bandwidth_gbps, graph_of, matmul_tflops, time_ms

EAGER_STEPS, GRAPH_STEPS = 3, 30  # few eager steps: they are only the launch-bound contrast
PREFILL_PATH = "torch reference Qwen35Model.forward, bf16, eager (cuBLAS matmuls, chunked GDN)"


def run_decode_bench(arch: str, contexts: list[int], weights: str = "bf16",
                     layers: int | None = None, command: str = "",
                     concurrency: list[int] = (), concurrency_context: int = 1024,
                     prefill: int = 0, prefill_chunk: int = 1024, prefill_reps: int = 1,
                     peer: str | None = None, peer_prompt: int = 1024,
                     peer_steps: int = 16, on_partial=None,
                     cuda_weights: str = "auto") -> dict:
    """Build the model on the GPU and time every requested section; the JSON-able result.

    `on_partial(result)`, if given, receives our sections before the peer starts (so a run cut
    short while timing the peer still leaves them)."""
    gbps = copy_bandwidth_gbps()
    tflops = matmul_tflops()
    _log(f"copy bandwidth {gbps:.0f} GB/s, bf16 matmul {tflops:.0f} TFLOP/s; "
         f"building synthetic {arch} on the GPU")
    result = dict(
        machine=dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                     triton=triton.__version__, python=platform.python_version(),
                     copy_gbps=gbps, matmul_tflops=tflops),
        command=command, date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        arch=arch, recipe=weights, cuda_weights=cuda_weights, batch=1,
        weights="random (synthetic, drawn on the GPU)")
    not_measured = {}
    result.update(_ours(arch, contexts, weights, cuda_weights, layers, list(concurrency),
                        concurrency_context, prefill, prefill_chunk, prefill_reps, gbps, tflops))
    gc.collect()  # every tensor of ours is gone before the peer is built
    torch.cuda.empty_cache()
    not_measured.update(result.pop("failed"))
    if "prefill" not in result and "prefill" not in not_measured:
        not_measured["prefill"] = "skipped (--prefill 0)"
    if not result.get("concurrency") and "concurrency" not in not_measured:
        not_measured["concurrency"] = "skipped (no --concurrency levels)"
    if peer == "transformers":
        from .peer import run_peer

        if on_partial is not None:
            on_partial({**result, "not_measured": {
                **not_measured, "peer": "did not finish (the run stopped while timing it)"}})
        result["peer"] = p = run_peer(result["config"], peer_prompt, peer_steps)
        if "decode_tok_s" in p:
            ours = min(result["decode"], key=lambda r: abs(r["context"] - peer_prompt))
            p.update(ours_context=ours["context"], ours_decode_tok_s=ours["tok_s"],
                     ratio_decode=ours["tok_s"] / p["decode_tok_s"])
            pre = result.get("prefill")
            if pre and pre["tokens"] == peer_prompt:
                p.update(ours_prefill_tok_s=pre["tok_s"],
                         ratio_prefill=pre["tok_s"] / p["prefill_tok_s"])
        else:
            not_measured["peer"] = p.get("skipped") or p.get("error", "failed")
    else:
        not_measured["peer"] = "skipped (--no-peer)"
    result["not_measured"] = not_measured
    return result


def _ours(arch, contexts, weights, mode, layers, concurrency, cctx, prefill, chunk, reps, gbps,
          tflops):
    """Every section measured on our model; its tensors are freed when this returns."""
    config, source = build_synthetic(arch, "cuda", torch.bfloat16, layers)
    fits = bf16_fits(config, free_device_bytes("cuda") if torch.cuda.is_available() else None)
    params = FusedParams(config, packed_source(source, weights, mode, fits))
    model = Qwen35Model(config, params)
    # room for the context plus every warm-up, eager and replayed step
    decoder = KernelDecoder(model, params, max(contexts) + 64)
    weights = decoder.weight_bytes()
    out = dict(layers=config["num_hidden_layers"], config=config,
               active_params=rf.active_params(config), weight_bytes_per_step=weights)
    forms = {layer["experts_gu"].fmt for layer in decoder.weights.layers if "moe" in layer}
    forms |= {layer["experts_down"].fmt for layer in decoder.weights.layers if "moe" in layer}
    if forms:  # how the routed experts were served: dense (bf16) and/or the fp8 forms
        out["routed_experts"] = "+".join(sorted(forms))
    rows = []
    for ctx in contexts:
        decoder.fill_random(ctx, token=1234 % config["vocab_size"])
        eager = time_ms(decoder.greedy_step, EAGER_STEPS)
        graph = graph_of(decoder.greedy_step)
        step = time_ms(graph.replay, GRAPH_STEPS)
        del graph
        nbytes = weights + decoder.state_bytes(ctx)
        roof = gbps * 1e9 / nbytes
        flop_roof = rf.tok_s(1, rf.decode_flops(config, ctx), tflops * 1e12)
        rows.append(dict(context=ctx, graph_step_ms=step, tok_s=1e3 / step, eager_step_ms=eager,
                         eager_tok_s=1e3 / eager, bytes_per_step=nbytes, roofline_tok_s=roof,
                         fraction_of_roofline=1e3 / step / roof, flop_roofline_tok_s=flop_roof))
        _log(f"context {ctx}: {1e3 / step:.1f} tok/s (roofline {roof:.0f})")
    out["decode"] = rows
    failed = {}
    if concurrency:
        try:
            out["concurrency"] = _concurrency(decoder, config, concurrency, cctx, gbps, tflops)
        except Exception as error:  # e.g. out of memory: keep the decode rows
            failed["concurrency"] = f"failed: {error!r}"[:500]
            _log(f"concurrency {failed['concurrency']}")
    del decoder
    torch.cuda.empty_cache()
    if prefill:
        try:
            out["prefill"] = _prefill(model, config, prefill, chunk, reps, tflops)
            if forms - {DENSE}:
                out["prefill"]["path"] += ("; fp8 routed experts decoded to bf16 per chunk "
                                           "(the routed ones) before the grouped matmuls")
        except Exception as error:
            failed["prefill"] = f"failed: {error!r}"[:500]
            _log(f"prefill {failed['prefill']}")
    out["failed"] = failed
    return out


def _concurrency(decoder, config, levels, ctx, gbps, tflops) -> list[dict]:
    rows = []
    for B in levels:
        batched = KernelDecoder(decoder.model, None, ctx + 64, batch=B, weights=decoder.weights)
        batched.fill_random(ctx, token=1234 % (config["vocab_size"] - B))
        graph = graph_of(batched.greedy_step)
        step = time_ms(graph.replay, GRAPH_STEPS)
        nbytes = batched.weight_bytes() + batched.state_bytes(ctx)
        del graph, batched
        torch.cuda.empty_cache()
        roof = rf.roofline(B, nbytes, B * rf.decode_flops(config, ctx), gbps, tflops)
        row = dict(concurrency=B, context=ctx, graph_step_ms=step, tok_s=B * 1e3 / step,
                   per_sequence_tok_s=1e3 / step, **roof)
        row["fraction_of_roofline"] = row["tok_s"] / roof["roofline_tok_s"]
        if "num_experts" in config:
            row["experts_read_per_layer"], row["experts_expected_per_layer"] = \
                rf.experts_read(config, B)
        rows.append(row)
        _log(f"concurrency {B}: {row['tok_s']:.1f} tok/s aggregate "
             f"(roofline {roof['roofline_tok_s']:.0f}, {roof['bound']})")
    return rows


@torch.no_grad()
def _prefill(model, config, tokens, chunk, reps, tflops) -> dict:
    chunk = chunk or tokens
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config["vocab_size"], (tokens,), generator=gen).to(model.device)

    def run(n):
        state = model.new_state()
        for start in range(0, n, chunk):
            model.forward(ids[start : min(n, start + chunk)], state, last_only=True)

    warm = min(tokens, 2 * chunk)  # an empty-state chunk and one over cached KV
    run(warm)
    ms = time_ms(lambda: run(tokens), reps, warm_up=False)
    n_chunks = -(-tokens // chunk)
    flops = rf.prefill_flops(config, tokens, n_chunks)
    roof = rf.tok_s(tokens, flops, tflops * 1e12)
    tok_s = tokens * 1e3 / ms
    achieved = flops / ms / 1e9
    _log(f"prefill {tokens}: {tok_s:.0f} tok/s ({achieved:.0f} TFLOP/s, roofline {roof:.0f})")
    return dict(tokens=tokens, chunk=chunk, chunks=n_chunks, warmup_tokens=warm, reps=reps,
                path=PREFILL_PATH, ms=ms, tok_s=tok_s, flops=flops,
                flops_per_token=flops / tokens, achieved_tflops=achieved,
                roofline_tok_s=roof, fraction_of_roofline=tok_s / roof,
                fraction_of_matmul_rate=achieved / tflops)


def markdown(result: dict) -> str:
    """The result as a markdown report: one table per measured section."""
    m = result["machine"]
    rate = f", bf16 matmul {m['matmul_tflops']:.0f} TFLOP/s" if "matmul_tflops" in m else ""
    lines = [
        f"# ninfer bench: {result['arch']} ({result['layers']} layers), "
        f"{result.get('recipe') or result['dtype']}"
        + (f" served as --cuda-weights {result['cuda_weights']}"
           if result.get("recipe", "bf16") != "bf16" and "cuda_weights" in result else ""),
        "",
        f"- machine: {m['device']}, torch {m['torch']}, Triton {m['triton']}, "
        f"Python {m['python']}; copy bandwidth {m['copy_gbps']:.0f} GB/s{rate}",
        f"- command: `{result['command']}`, {result['date']}",
        f"- weights: {result['weights']}; "
        + (f"routed experts {result['routed_experts']}; " if "routed_experts" in result else "")
        + f"{result['weight_bytes_per_step'] / 1e9:.2f} GB read "
        "per batch-1 step",
        "",
        "## Batch-1 decode",
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
    if result.get("concurrency"):
        moe = "experts_read_per_layer" in result["concurrency"][0]
        lines += ["", "## Aggregate decode at concurrency B (one CUDA-graph step of B sequences)",
                  "", "| B | context | aggregate tok/s | per sequence | step ms "
                  + ("| experts read / layer " if moe else "")
                  + "| bytes/step | bandwidth roofline | FLOP roofline | % of roofline |",
                  "|---" * (9 + moe) + "|"]
        for r in result["concurrency"]:
            experts = (f"| {r['experts_read_per_layer']} (≈{r['experts_expected_per_layer']:.0f}"
                       " expected) " if moe else "")
            lines.append(
                f"| {r['concurrency']} | {r['context']} | {r['tok_s']:.1f} "
                f"| {r['per_sequence_tok_s']:.1f} | {r['graph_step_ms']:.2f} {experts}"
                f"| {r['bytes_per_step'] / 1e9:.2f} GB | {r['bandwidth_roofline_tok_s']:.0f} "
                f"| {r['flop_roofline_tok_s']:.0f} | {100 * r['fraction_of_roofline']:.0f} % |")
        lines += ["", "Roofline = the lower of bandwidth (weights read once per step"
                  + (", routed experts for min(E, B·top_k) per layer" if moe else "")
                  + ", plus every sequence's GDN state and KV) and FLOPs (2 × active params × B "
                  "+ attention) over the measured matmul rate."]
    p = result.get("prefill")
    if p:
        lines += ["", f"## Prefill of a {p['tokens']}-token prompt", "",
                  "| tokens | chunk | ms | tok/s | GFLOP/token | TFLOP/s achieved "
                  "| roofline tok/s | % of roofline (= of matmul rate) |",
                  "|---|---|---|---|---|---|---|---|",
                  f"| {p['tokens']} | {p['chunk']} | {p['ms']:.0f} | {p['tok_s']:.0f} "
                  f"| {p['flops_per_token'] / 1e9:.1f} | {p['achieved_tflops']:.0f} "
                  f"| {p['roofline_tok_s']:.0f} | {100 * p['fraction_of_roofline']:.0f} % |",
                  "", f"Path: {p['path']}; {p['reps']} timed pass(es) after a "
                  f"{p['warmup_tokens']}-token warm-up. FLOPs: 2 × non-head params per token, "
                  "the head once per chunk, causal attention; the GDN recurrence is not counted."]
    peer = result.get("peer")
    if peer and "decode_tok_s" in peer:
        impl = ", ".join(f"{k} {peer[k]}" for k in ("attn_implementation", "experts_implementation",
                                                     "fla", "causal_conv1d") if k in peer)
        lines += ["", "## Peer: transformers on the same shapes, same GPU, same run", "",
                  "| | prompt | prefill tok/s | decode tok/s (batch 1) | ninfer decode tok/s "
                  "| ninfer / peer |", "|---|---|---|---|---|---|",
                  f"| transformers {peer['version']} | {peer['prompt_tokens']} "
                  f"| {peer['prefill_tok_s']:.0f} | {peer['decode_tok_s']:.2f} "
                  f"| {peer['ours_decode_tok_s']:.1f} ({peer['ours_context']} context) "
                  f"| {peer['ratio_decode']:.1f}× |",
                  "", f"Peer: {impl}; decode timed over {peer['decode_steps']} greedy steps "
                  "with its own cache after the prompt."]
        if "ratio_prefill" in peer:
            lines.append(f"Prefill at the same length: ninfer {peer['ours_prefill_tok_s']:.0f} "
                         f"tok/s, {peer['ratio_prefill']:.2f}× the peer.")
    nm = result.get("not_measured") or {}
    if nm:
        lines += ["", "Not measured: " + "; ".join(f"{k}: {v}" for k, v in nm.items()) + "."]
    return "\n".join(lines) + "\n"


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
