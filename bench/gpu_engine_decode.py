"""The llama family's engine decode step on one GPU: eager vs static buffers + CUDA graphs.

    python3 bench/gpu_engine_decode.py [--out bench/results/h200-engine-decode.json] [--peer]
        [--verify K] [--prompt N]

For each model shape (random bf16 weights drawn on the GPU) and batch size, B sequences hold
`--context` tokens of random KV (and GDN state) in the engine's paged pool and state slots; one
decode step is timed through
* the eager runner path (`LlamaModel.forward` over one-token segments): what the engine runs
  for steps that carry a prefill chunk, and
* `DecodeGraphs` (decode_graphs.py): the step the engine serves pure-decode batches with,
  host-side input loading included, replayed from its captured graph.
With `--verify K`, one verify step of 1 + K tokens a row (the last token and K drafts, what
`--spec` verifies) is timed the same two ways: `DecodeGraphs.verify` replaying its captured
graph, and the eager forward over (1 + K)-token segments (the llama family's verify steps ran
there before the static step took verify rows). With `--prompt N`, an N-token prompt chunk
(≤ 64: an agent's turn over the `--context` tokens cached) a row, through the captured prompt
step (`DecodeGraphs.prefill`, `llama_prompt_step.LlamaPrompt`) and through the eager forward.
The hybrid family's step is timed by `ninfer bench` through the engine itself (earlier result
files of this script also hold hybrid rows, measured by the code of their date).
The roofline is (weights + every row's KV and GDN state at that context) / the copy bandwidth
measured in the same run. With --peer, `transformers` builds the llama shapes (bf16, SDPA, its
dynamic cache) and decodes batch 1 at the same context (`ninfer bench` has the hybrid peers).
"""
from __future__ import annotations

import argparse
import gc
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import torch
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.report import write_report  # noqa: E402
from ninfer_engine.benchmark.peer import hf_decode, hf_prefill, random_model  # noqa: E402
from ninfer_engine.benchmark.timing import copy_bandwidth_gbps, time_ms  # noqa: E402
from ninfer_engine.models.llama_prompt_step import LlamaPrompt  # noqa: E402
from ninfer_engine.models.llama_step import StaticDecoder  # noqa: E402
from ninfer_engine.step.decode_graphs import PROMPT_ROWS, DecodeGraphs  # noqa: E402
from ninfer_engine.kv import KvStorage, PagePool, codecs_for  # noqa: E402
from ninfer_engine.models import LlamaConfig, LlamaModel, Segment  # noqa: E402

# HF config fields of public models (their config.json), weights random
SHAPES = {
    "smollm2-135m": dict(architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True),
    "llama-3.2-1b": dict(architectures=["LlamaForCausalLM"], vocab_size=128256,
                         hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         rms_norm_eps=1e-5, rope_theta=500000.0,
                         max_position_embeddings=131072, tie_word_embeddings=True),
    "qwen3-8b": dict(architectures=["Qwen3ForCausalLM"], vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                     rope_theta=1000000.0, max_position_embeddings=40960,
                     tie_word_embeddings=False),
}
STEPS = 50


class RandomWeights:
    """A `WeightSource` drawing every tensor on the GPU (norms near 1, matrices ~N(0, 0.02))."""

    def __init__(self, qk_norm: bool) -> None:
        self.qk_norm = qk_norm

    def parameter(self, name, shape, dtype=torch.bfloat16):
        t = torch.empty(shape, device="cuda", dtype=dtype)
        return t.fill_(1.0) if len(shape) == 1 else t.normal_(std=0.02)

    def has_parameter(self, name):  # the model asks only about the optional Q/K norms
        return self.qk_norm


def _sequences(model, storage, batch, context):
    seqs = []
    for b in range(batch):
        cache = storage.new_cache()
        assert cache.reserve(context + STEPS + 8)
        seqs.append(SimpleNamespace(cache=cache, cached=context, output=[17 + b]))
    for layer in (*storage.k, *storage.v):
        layer[0].normal_()
    return seqs


def _eager(model, seqs, drafts: int = 0):
    """The eager forward of each row's last token and `drafts` more (logits of every token)."""
    on, q = model.device, 1 + drafts
    model.forward(torch.tensor([t for s in seqs for t in [s.output[-1]] + [1] * drafts],
                               device=on),
                  torch.tensor([s.cached + t for s in seqs for t in range(q)], device=on),
                  [Segment(s.cache, s.cached, q) for s in seqs],
                  torch.arange(len(seqs) * q, device=on))


def _eager_chunk(model, seqs, n):
    """The eager forward of an n-token chunk a row after `cached` (each chunk's last logits)."""
    on = model.device
    model.forward(torch.tensor([5] * n * len(seqs), device=on),
                  torch.tensor([s.cached + t for s in seqs for t in range(n)], device=on),
                  [Segment(s.cache, s.cached, n) for s in seqs],
                  torch.arange(n - 1, n * len(seqs), n, device=on))


def bench_shape(name, cfg, batches, context, gbps, verify=0, prompt=0):
    config = LlamaConfig.from_text_config(cfg)
    model = LlamaModel(config, RandomWeights(cfg["architectures"][0] == "Qwen3ForCausalLM"),
                       "cuda", torch.bfloat16)
    layers, heads, dim = model.kv_layout()
    pages = max(batches) * (-(-(context + STEPS + 8) // 64)) + 8
    storage = KvStorage(PagePool(pages, 64), layers, heads, dim, codecs_for("bf16", model.dtype),
                        model.dtype, "cuda")
    weights = model.weight_bytes()
    rows = []
    for batch in batches:
        seqs = _sequences(model, storage, batch, context)
        eager = time_ms(lambda: _eager(model, seqs), 10)
        for s in seqs:
            s.cached = context
        graphs = DecodeGraphs(StaticDecoder(model, storage, batch, context + STEPS + 8), True)
        step = time_ms(lambda: graphs.forward(seqs), STEPS)
        kv = batch * (context + STEPS // 2) * layers * 2 * heads * dim * 2
        roofline = batch * gbps * 1e9 / (weights + kv)
        rows.append(dict(batch=batch, context=context, graph_step_ms=step,
                         tok_s=batch * 1e3 / step, eager_step_ms=eager,
                         eager_tok_s=batch * 1e3 / eager, bytes_per_step=weights + kv,
                         roofline_tok_s=roofline,
                         fraction_of_roofline=batch * 1e3 / step / roofline))
        print(f"{name} B={batch}: graph {batch * 1e3 / step:.0f} tok/s, eager "
              f"{batch * 1e3 / eager:.0f}, roofline {roofline:.0f}", file=sys.stderr, flush=True)
        if verify:  # the rows back where they started: verify leaves `cached` alone
            for s in seqs:
                s.cached = context
            verifier = DecodeGraphs(StaticDecoder(model, storage, batch, context + STEPS + 8,
                                                  max_q=1 + verify), True)
            drafts = [[1] * verify] * batch
            graph_ms = time_ms(lambda: verifier.verify(seqs, drafts), STEPS)
            eager_ms = time_ms(lambda: _eager(model, seqs, verify), 10)
            rows[-1].update(verify=verify, verify_graph_ms=graph_ms, verify_eager_ms=eager_ms)
            print(f"{name} B={batch}: verify 1+{verify} graph {graph_ms:.3f} ms "
                  f"({graph_ms / step:.2f}x decode), eager {eager_ms:.3f} ms",
                  file=sys.stderr, flush=True)
            del verifier
        if prompt:  # each row's chunk over its `context` cached tokens, cached left there
            for s in seqs:
                s.cached = context
            step_graphs = DecodeGraphs(StaticDecoder(model, storage, batch, context + STEPS + 8),
                                       True, LlamaPrompt(model, storage, batch,
                                                         context + STEPS + 8, PROMPT_ROWS[-1]))
            chunks = [[5] * prompt] * batch

            def prefill():
                step_graphs.prefill(seqs, chunks)
                for s in seqs:
                    s.cached = context
            graph_ms = time_ms(prefill, STEPS)
            eager_ms = time_ms(lambda: _eager_chunk(model, seqs, prompt), 10)
            rows[-1].update(prompt=prompt, prompt_graph_ms=graph_ms, prompt_eager_ms=eager_ms)
            print(f"{name} B={batch}: {prompt}-token chunk graph {graph_ms:.3f} ms, eager "
                  f"{eager_ms:.3f} ms", file=sys.stderr, flush=True)
            del step_graphs
        for s in seqs:
            s.cache.release()
        del graphs
    del model, storage
    gc.collect()
    torch.cuda.empty_cache()
    return dict(shape=name, weight_bytes=weights, decode=rows)


def transformers_peer(name, cfg, context):
    """Batch-1 greedy decode tok/s of the same shape in transformers (its own cache, SDPA)."""
    try:
        import transformers
        from transformers import AutoConfig
    except ImportError as exc:
        return dict(shape=name, error=f"transformers unavailable: {exc}")
    fields = {k: v for k, v in cfg.items() if k != "architectures"}
    model_type = "qwen3" if cfg["architectures"][0] == "Qwen3ForCausalLM" else "llama"
    hf_cfg = AutoConfig.for_model(model_type, **fields)
    model = random_model(getattr(transformers, cfg["architectures"][0]), hf_cfg, "cuda")
    ids = torch.randint(0, cfg["vocab_size"], (1, context), device="cuda")
    token, cache = hf_prefill(model, ids)
    steps = 20
    ms = time_ms(lambda: hf_decode(model, token, cache, steps), 1) / steps
    del model, cache
    gc.collect()
    torch.cuda.empty_cache()
    return dict(shape=name, transformers=transformers.__version__, batch=1, context=context,
                step_ms=ms, tok_s=1e3 / ms)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/h200-engine-decode.json")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--peer", action="store_true", help="also time transformers (batch 1)")
    ap.add_argument("--verify", type=int, default=0, metavar="K",
                    help="also time a verify step of 1 + K tokens a row (graph and eager)")
    ap.add_argument("--prompt", type=int, default=0, metavar="N",
                    help="also time an N-token prompt chunk a row, N <= 64 (graph and eager)")
    args = ap.parse_args()
    torch.manual_seed(0)
    gbps = copy_bandwidth_gbps()
    batches = [int(b) for b in args.batches.split(",")]
    results, peers = [], []
    with torch.inference_mode():
        for name in args.shapes.split(","):
            results.append(bench_shape(name, SHAPES[name], batches, args.context, gbps,
                                       args.verify, args.prompt))
    if args.peer:
        for name in args.shapes.split(","):
            if name not in SHAPES:
                continue
            peers.append(transformers_peer(name, SHAPES[name], args.context))
            print(f"peer {peers[-1]}", file=sys.stderr, flush=True)
    result = dict(
        machine=dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                     triton=triton.__version__, python=platform.python_version(),
                     copy_gbps=gbps),
        command="python3 bench/gpu_engine_decode.py " + " ".join(sys.argv[1:]),
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        weights="random bf16 (drawn on the GPU)", kv_dtype="bf16", results=results, peer=peers)
    write_report(args.out, result, markdown)


def markdown(result: dict) -> str:
    m = result["machine"]
    peers = {p["shape"]: p for p in result["peer"]}
    lines = ["# The engine's decode step: eager vs CUDA graphs", "",
             f"- machine: {m['device']}, torch {m['torch']}, Triton {m['triton']}, "
             f"Python {m['python']}; copy bandwidth {m['copy_gbps']:.0f} GB/s",
             f"- command: `{result['command']}`, {result['date']}",
             f"- weights: {result['weights']}; KV {result['kv_dtype']}", "",
             "| shape | batch | context | tok/s (graphs) | eager tok/s "
             "| roofline tok/s | % of roofline | transformers tok/s (batch 1) | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in result["results"]:
        peer = peers.get(r["shape"], {})
        for row in r["decode"]:
            p = peer.get("tok_s") if row["batch"] == 1 else None
            ratio = f"{row['tok_s'] / p:.1f}×" if p else ""
            lines.append(
                f"| {r['shape']} | {row['batch']} | {row['context']} | {row['tok_s']:.0f} "
                f"| {row['eager_tok_s']:.0f} | {row['roofline_tok_s']:.0f} "
                f"| {100 * row['fraction_of_roofline']:.0f} % | {f'{p:.0f}' if p else ''} "
                f"| {ratio} |")
    verified = [(r["shape"], row) for r in result["results"] for row in r["decode"]
                if row.get("verify")]
    if verified:
        lines += ["", "A verify step of 1 + K tokens a row (the last token and K drafts):", "",
                  "| shape | batch | K | graph ms | × the decode graph step | eager ms "
                  "| eager / graph |", "|---|---|---|---|---|---|---|"]
        for shape, row in verified:
            g, e = row["verify_graph_ms"], row["verify_eager_ms"]
            lines.append(f"| {shape} | {row['batch']} | {row['verify']} | {g:.3f} "
                         f"| {g / row['graph_step_ms']:.2f}× | {e:.3f} | {e / g:.1f}× |")
    prompted = [(r["shape"], row) for r in result["results"] for row in r["decode"]
                if row.get("prompt")]
    if prompted:
        lines += ["", "An N-token prompt chunk a row over the cached context (an agent's turn):",
                  "", "| shape | batch | context | N | graph ms | eager ms | eager / graph |",
                  "|---|---|---|---|---|---|---|"]
        for shape, row in prompted:
            g, e = row["prompt_graph_ms"], row["prompt_eager_ms"]
            lines.append(f"| {shape} | {row['batch']} | {row['context']} | {row['prompt']} "
                         f"| {g:.3f} | {e:.3f} | {e / g:.1f}× |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
