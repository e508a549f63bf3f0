"""The llama family's decode step over static buffers, for `step.decode_graphs.DecodeGraphs`.

`StaticDecoder` runs one step of a `LlamaModel` whose inputs (token, position, KV slot and
length per token row; the rows' page tables) live in fixed device buffers: each layer writes
its K/V into the shared paged pool in place and attends with the Triton paged-attention kernel,
so the step is capturable in a CUDA graph. A row carries 1 token (decode) or 1 + k (verify: its
last token and k drafts, `max_q` ≥ 1 + k), each token a query row over its sequence's pages up
to its own position, which is the causal mask within the row. Off CUDA it runs eagerly through
the kernels' torch references.
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
    """One step of a `LlamaModel` whose inputs live in fixed device buffers: up to
    `max_batch` rows of `q_len` ≤ `max_q` tokens, sequence-major (row b's token t is token row
    b·q_len + t)."""

    def __init__(self, model: LlamaModel, storage: KvStorage, max_batch: int,
                 max_context: int, max_q: int = 1) -> None:
        self.model, self.storage = model, storage
        self.max_batch, self.max_context, self.max_q = max_batch, max_context, max_q
        dev = model.device
        # token rows: token, position, KV slot, length of the keys it attends over
        self.meta = torch.zeros(4, max_batch * max_q, dtype=torch.long, device=dev)
        self.table = torch.zeros(max_batch, -(-max_context // PAGE), dtype=torch.long,
                                 device=dev)
        self.tables = PageTables(self.table)
        self.token_rows = torch.arange(max_batch * max_q, device=dev)

    def load(self, seqs: list, drafts: list[list[int]] | None = None) -> None:
        """Copy each row's tokens (its next input, then its drafts) with their positions,
        slots and lengths, and the rows' page tables, into the buffers."""
        page = self.storage.page_tokens
        rows = []
        for b, seq in enumerate(seqs):
            pages = seq.cache.pages
            for t, token in enumerate([input_token(seq), *(drafts[b] if drafts else ())]):
                pos = seq.cached + t
                rows.append((token, pos, pages[pos // page] * page + pos % page, pos + 1))
        # not waiting for the work queued before (a lookahead step loads behind one in flight)
        self.meta[:, : len(rows)].copy_(torch.tensor(rows, dtype=torch.long).t().contiguous(),
                                        non_blocking=True)
        self.tables.fill([seq.cache for seq in seqs])

    def feed(self, tokens: torch.Tensor) -> None:
        """The loaded rows' input tokens from the device (the last step's picks)."""
        self.meta[0, : tokens.shape[0]].copy_(tokens)

    def save_state(self, batch: int) -> Callable[[], None]:
        """Nothing to save: a step's K/V writes are the same when it runs again."""
        return lambda: None

    def keep_rows(self, back: list[tuple[int, int]]) -> None:
        """After a verify step: nothing to roll back (no recurrent state); the K/V past the
        kept tokens is left to be overwritten."""

    def step(self, batch: int, bucket: int, q_len: int = 1) -> torch.Tensor:
        """Logits [batch · q_len, V] (fp32) of the loaded token rows; `bucket` ≥ every row's
        length sizes the attention kernel's split grid."""
        n = batch * q_len
        lens = self.meta[3, :n]
        # each token row reads its sequence's page table
        table = self.table[self.token_rows[:n] // q_len] if q_len > 1 else self.table[:batch]
        return self.logits(self.hidden_rows(n, lambda q, k, v: paged_attention(
            q, k, v, table, lens, max_seq_len=bucket)))

    def hidden_rows(self, n: int, attend: Callable) -> torch.Tensor:
        """The final-normed hiddens [n, H] of the loaded token rows 0..n-1, each layer's K/V
        of them written into the pool first and `attend(q, k_pages, v_pages)` its attention."""
        m, s = self.model, self.storage
        c = m.cfg
        nq, nkv, D, eps = c.num_heads, c.num_kv_heads, c.head_dim, c.rms_norm_eps
        tokens, positions, slots = (r[:n] for r in self.meta[:3])
        x = F.embedding(tokens, m.embedding)
        residual = None
        for i, layer in enumerate(m.layers):
            h, residual = fused_rms_norm(x, layer.input_norm, eps, residual)
            qkv = layer.qkv(h)
            qk = qkv[:, : (nq + nkv) * D].view(n, nq + nkv, D)
            v = qkv[:, (nq + nkv) * D:].view(n, nkv, D)
            if layer.qk_norm is not None:
                qk = rms_norm(qk, None, eps) * layer.qk_norm
            qk = rope(qk, positions, D, c.rope_theta)
            q, k = qk[:, :nq], qk[:, nq:]
            s.k_codec.write(s.k[i], slots, k)
            s.v_codec.write(s.v[i], slots, v)
            attn = attend(q, s.page_view(s.k[i]), s.page_view(s.v[i]))
            x = m.ranks.all_reduce(layer.output(attn.reshape(n, nq * D)))
            h, residual = fused_rms_norm(x, layer.post_attention_norm, eps, residual)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = m.ranks.all_reduce(layer.down(F.silu(gate) * up))
        return fused_rms_norm(x, m.final_norm, eps, residual)[0]

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """The head over final-normed hiddens: [T, V] fp32."""
        m = self.model
        return m.ranks.gather_vocab(m.head(h).float(), m.cfg.vocab_size)
