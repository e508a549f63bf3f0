"""The llama family's decode step over static buffers, for `step.decode_graphs.DecodeGraphs`.

`StaticDecoder` runs one decode step of a `LlamaModel` whose inputs (token, position, KV slot
and length per row; the rows' page tables) live in fixed device buffers: each layer writes its
K/V into the shared paged pool in place and attends with the Triton paged-attention kernel, so
the step is capturable in a CUDA graph. Off CUDA it runs eagerly through the kernels' torch
references.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..kernels.paged_attention import PAGE, paged_attention
from ..kernels.rmsnorm import rms_norm as fused_rms_norm
from ..kernels.rotary import rope
from ..kv import KvStorage, PageTables
from .attention import input_token
from .layers import rms_norm
from .llama import LlamaModel


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

    def load(self, seqs: list, drafts: list[list[int]] | None = None) -> None:
        """Copy the rows' next token, position, slot, length and page table into the buffers."""
        if drafts:
            raise NotImplementedError("verify rows in the llama static decode step")
        page = self.storage.page_tokens
        rows = []
        for seq in seqs:
            pos = seq.cached
            pages = seq.cache.pages
            rows.append((input_token(seq), pos, pages[pos // page] * page + pos % page, pos + 1))
        # not waiting for the work queued before (a lookahead step loads behind one in flight)
        self.meta[:, : len(seqs)].copy_(torch.tensor(rows, dtype=torch.long).t().contiguous(),
                                        non_blocking=True)
        self.tables.fill([seq.cache for seq in seqs])

    def feed(self, tokens: torch.Tensor) -> None:
        """The loaded rows' input tokens from the device (the last step's picks)."""
        self.meta[0, : tokens.shape[0]].copy_(tokens)

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
            x = m.ranks.all_reduce(layer.output(attn.reshape(batch, nq * D)))
            h, residual = fused_rms_norm(x, layer.post_attention_norm, eps, residual)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = m.ranks.all_reduce(layer.down(F.silu(gate) * up))
        h, _ = fused_rms_norm(x, m.final_norm, eps, residual)
        return m.ranks.gather_vocab(m.head(h).float(), c.vocab_size)
