"""Pure-decode steps over static buffers, replayed as CUDA graphs.

A pure-decode step (one new token for each of B running sequences, no prefill chunk) reads its
inputs from fixed device buffers: token, position, KV slot and length per row, and the rows'
page tables. Every layer writes its K/V into the shared paged pool in place and attends with the
Triton paged-attention kernel (`kernels.paged_attention`, every KV dtype dequantized inside it), so
the whole step is one fixed sequence of kernels: `DecodeGraphs` captures it once per (batch
size, context bucket) and replays it, which removes the Python and launch cost of ~10 kernels
per layer. `StaticDecoder` is the llama family's step (off CUDA it runs eagerly through the
kernels' torch references, which is how the CPU tests check it against the model's forward);
`hybrid_decode.EngineHybridDecoder` is the Qwen3.5 family's.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from .kernels.paged_attention import PAGE, paged_attention
from .kernels.rmsnorm import rms_norm as fused_rms_norm
from .kernels.rotary import rope
from .hybrid_decode import EngineHybridDecoder
from .kv import KV_DTYPES, KvStorage, PageTables, SequenceMemory
from .kv.slots import StateSlot
from .models import LlamaModel, Qwen35Model
from .models.fused import FusedParams
from .models.layers import rms_norm
from .scheduler import Sequence

log = logging.getLogger("ninfer.engine")

GRAPH_CODECS = KV_DTYPES  # the KV layouts the paged-attention kernel reads in place: all
MIN_BUCKET = 1024  # smallest context bucket (tokens); buckets double up to the max context


class StaticDecoder:
    """One decode step of a `LlamaModel` whose inputs live in fixed device buffers."""

    def __init__(self, model: LlamaModel, storage: KvStorage, max_batch: int,
                 max_context: int) -> None:
        self.model, self.storage = model, storage
        self.max_batch, self.max_context = max_batch, max_context
        self.max_q = 1  # decode rows only
        dev = model.device
        # rows: token, position, KV slot, sequence length after this step
        self.meta = torch.zeros(4, max_batch, dtype=torch.long, device=dev)
        self.table = torch.zeros(max_batch, -(-max_context // PAGE), dtype=torch.long,
                                 device=dev)
        self.tables = PageTables(self.table)

    def load(self, seqs: list[Sequence], drafts: list[list[int]] | None = None) -> None:
        """Copy the rows' next token, position, slot, length and page table into the buffers."""
        if drafts:
            raise NotImplementedError("verify rows in the llama static decode step")
        page = self.storage.page_tokens
        rows = []
        for seq in seqs:
            pos = seq.cached
            pages = seq.cache.pages
            rows.append((seq.output[-1], pos, pages[pos // page] * page + pos % page, pos + 1))
        self.meta[:, : len(seqs)].copy_(torch.tensor(rows, dtype=torch.long).t())
        self.tables.fill([seq.cache for seq in seqs])

    def save_state(self, batch: int) -> Callable[[], None]:
        """Nothing to save: a step's K/V writes are the same when it runs again."""
        return lambda: None

    def step(self, batch: int, bucket: int, q_len: int = 1) -> torch.Tensor:
        """Logits [batch, V] (fp32) of the loaded rows; `bucket` ≥ every row's length sizes the
        attention kernel's split grid."""
        m, s = self.model, self.storage
        c = m.cfg
        nq, nkv, D, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        tokens, positions, slots, lens = (r[:batch] for r in self.meta)
        table = self.table[:batch]
        x = F.embedding(tokens, m.embedding)
        residual = None
        for i, layer in enumerate(m.layers):
            h, residual = fused_rms_norm(x, layer.input_norm, eps, residual)
            qkv = layer.qkv(h)
            qk = qkv[:, : (nq + nkv) * D].view(batch, nq + nkv, D)
            v = qkv[:, (nq + nkv) * D:].view(batch, nkv, D)
            if layer.qk_norm is not None:
                qk = rms_norm(qk, None, eps) * layer.qk_norm
            qk = rope(qk, positions, D, c.rope_theta)
            q, k = qk[:, :nq], qk[:, nq:]
            s.k_codec.write(s.k[i], slots, k)
            s.v_codec.write(s.v[i], slots, v)
            attn = paged_attention(q, s.page_view(s.k[i]), s.page_view(s.v[i]), table, lens,
                                   max_seq_len=bucket)
            x = layer.output(attn.reshape(batch, nq * D))
            h, residual = fused_rms_norm(x, layer.post_attention_norm, eps, residual)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = layer.down(F.silu(gate) * up)
        h, _ = fused_rms_norm(x, m.final_norm, eps, residual)
        return m.head(h).float()


class DecodeGraphs:
    """Runs pure-decode batches through a static decoder (`load` → `step`), as CUDA graphs
    when `capture`.

    One graph per (batch size, context bucket), captured at load for the first bucket
    (`capture_at_start`) and otherwise the first time that shape runs, on the step's real
    inputs. The warm-up before a capture runs the step once, which advances the rows' recurrent
    state in their slots: `_record` saves that state first and puts it back (`save_state`),
    so the replay computes the step exactly once; its K/V writes land where the replay's do.
    Graphs read the pool tensors they were captured with; when an elastic pool grows into new
    tensors, every graph is dropped and recaptured on demand.
    """

    def __init__(self, decoder: StaticDecoder | EngineHybridDecoder, capture: bool) -> None:
        self.decoder = decoder
        self.capture = capture
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._bound_k = decoder.storage.k
        self._q_len = 1  # tokens a row in the last step

    def accepts(self, seqs: list[Sequence]) -> bool:
        return 0 < len(seqs) <= self.decoder.max_batch

    def forward(self, seqs: list[Sequence]) -> torch.Tensor:
        """Logits [len(seqs), V] for each sequence's next token; advances `cached`."""
        logits = self._run(seqs, None, 1)
        for seq in seqs:
            seq.cached += 1
        return logits

    def verify(self, seqs: list[Sequence], drafts: list[list[int]]) -> torch.Tensor:
        """Logits [len(seqs), 1 + k, V] of each sequence's last token and its k drafts (the
        same k for every row, 1 + k ≤ the decoder's `max_q`): the target's token after each.
        Leaves `cached` alone: `keep` settles each row once its accepted length is known."""
        q_len = 1 + len(drafts[0])
        assert all(len(d) == q_len - 1 for d in drafts) and q_len <= self.decoder.max_q
        return self._run(seqs, drafts, q_len).view(len(seqs), q_len, -1)

    def keep(self, seqs: list[Sequence], kept: list[int]) -> None:
        """After `verify`: row i keeps its first `kept[i]` tokens (1 ≤ kept ≤ 1 + k, the last
        sampled token included): its GDN state goes back to the state after them, its K/V past
        them is left to be overwritten, and `cached` advances by `kept`."""
        for row, (seq, n) in enumerate(zip(seqs, kept)):
            if n < self._q_len:
                self.decoder.keep(row, n)
            seq.cached += n

    def _run(self, seqs, drafts, q_len: int) -> torch.Tensor:
        d = self.decoder
        d.load(seqs, drafts)
        batch, self._q_len = len(seqs), q_len
        bucket = context_bucket(max(seq.cached + q_len for seq in seqs), d.max_context)
        if not self.capture:
            return d.step(batch, bucket, q_len)
        if d.storage.k is not self._bound_k:  # the pool grew into new tensors
            self._graphs.clear()
            self._bound_k = d.storage.k
        key = (batch, bucket, q_len)
        if key not in self._graphs:
            self._graphs[key] = self._record(batch, bucket, q_len)
            d.load(seqs, drafts)  # the warm-up moved the positions in the buffers
        graph, logits = self._graphs[key]
        graph.replay()
        return logits

    def _record(self, batch: int, bucket: int,
                q_len: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        d = self.decoder

        def step():
            return d.step(batch, bucket, q_len)
        saved = d.save_state(batch)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: compiles the Triton kernels, same inputs
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = step()
        saved()
        log.info("captured the decode CUDA graph for batch %d, %d token(s) a row, context ≤ %d",
                 batch, q_len, bucket)
        return graph, logits

    def capture_at_start(self) -> None:
        """Capture the first context bucket for every batch size now, on scratch sequences in
        state slots 0.. (nobody holds a slot yet; a slot is zeroed when acquired) all on one
        pool page, which goes back after (their K/V writes are garbage nobody reads, and an
        elastic pool does not grow for them), so the first burst of traffic replays graphs
        instead of compiling kernels and capturing (~5 s at batch 8 on the H200)."""
        cache = self.decoder.storage.new_cache()
        try:
            if not cache.reserve(1):
                return
            scratch = [SimpleNamespace(cache=cache, cached=0, output=[0],
                                       state=StateSlot(i, []))
                       for i in range(self.decoder.max_batch)]
            for batch in range(1, len(scratch) + 1):
                for seq in scratch:
                    seq.cached = 0
                self.forward(scratch[:batch])
        finally:
            cache.release()


def context_bucket(length: int, max_context: int) -> int:
    """The graph bucket of a step whose longest row is `length` tokens: powers of two from
    `MIN_BUCKET`, capped at the pool's context (or the length itself, if longer)."""
    bucket = MIN_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, max(max_context, length))


def build_decode_graphs(model, memory: SequenceMemory, kv_dtype: str, max_batch: int,
                        max_context: int, use_graphs: bool) -> DecodeGraphs | None:
    """The static decode path over `memory`'s KV pool and running-state slots when the model,
    device and KV layout allow it, else None."""
    storage = memory.storage
    if kv_dtype not in GRAPH_CODECS or not storage.kernel_layout:
        return None
    if model.device.type != "cuda" or model.dtype != torch.bfloat16:
        return None  # the CPU keeps the exact eager path; the kernels compute in bf16
    _, _, D = model.kv_layout()
    if D & (D - 1) or D < 16:
        return None  # the attention kernel tiles whole power-of-two heads
    if isinstance(model, LlamaModel):
        decoder = StaticDecoder(model, storage, max_batch, max_context)
    elif isinstance(model, Qwen35Model) and isinstance(model.params, FusedParams):
        decoder = EngineHybridDecoder(model, storage, memory.running_slots, max_batch,
                                      max_context)
    else:
        return None
    graphs = DecodeGraphs(decoder, capture=use_graphs)
    if use_graphs:
        graphs.capture_at_start()
    return graphs
