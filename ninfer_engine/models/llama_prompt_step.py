"""Short prompt chunks of the llama family as one step over static buffers, for CUDA graphs.

The llama counterpart of `qwen3_5_prompt_step.PromptStep`: an agent's turn over a cached
prefix computes a few dozen new tokens, which the eager forward spends mostly host time on.
`LlamaPrompt` runs up to `max_batch` sequences' chunks, each padded to one row count, through
`llama_step.StaticDecoder`'s layer loop: every row's K/V is stored at its position in its
sequence's pages (the padding rows' past the chunk, which the tokens after it overwrite before
anything reads them: the caller makes sure the lease covers the padded rows), each chunk's rows
attend over its pages with the varlen `kernels.paged_prefill` kernel (its offsets, lengths and
starts read from the device), and the head reads each chunk's last real row only. So the step
is one fixed sequence of kernels whatever the chunks' lengths and contexts, and
`step.decode_graphs.DecodeGraphs.prefill` captures and replays it.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..kernels.paged_prefill import paged_prefill_varlen_triton
from ..kv import KvStorage
from .llama import LlamaModel
from .llama_step import StaticDecoder


class LlamaPrompt:
    """Up to `max_batch` prompt chunks of up to `rows` tokens each, for `DecodeGraphs.prefill`:
    `load(seqs, tokens, rows)` then `step(batch, rows)` (logits [batch, V] after each chunk's
    last real token)."""

    hidden = None  # (no drafter reads llama hiddens)

    def __init__(self, model: LlamaModel, storage: KvStorage, max_batch: int,
                 max_context: int, rows: int) -> None:
        self.storage, self.max_batch, self.rows = storage, max_batch, rows
        self.core = StaticDecoder(model, storage, max_batch, max_context, max_q=rows)
        # int32 [4, max_batch], per chunk: its first token row (b · rows), its rows (the padded
        # count: every row attends), its first position, its real tokens
        self.chunk = torch.zeros(4, max_batch, dtype=torch.int32, device=model.device)

    def load(self, seqs, tokens: list[list[int]], rows: int) -> None:
        """`tokens[b]`, sequence b's prompt from its `cached` on, padded to `rows` (each lease
        must cover `cached + rows` positions: the padding rows' K/V go there)."""
        B, page = len(seqs), self.storage.page_tokens
        assert 0 < B <= self.max_batch and rows <= self.rows
        meta = torch.zeros(4, B * rows, dtype=torch.long)
        chunk = torch.zeros(4, B, dtype=torch.int32)
        for b, (seq, ids) in enumerate(zip(seqs, tokens)):
            n, at, pages = len(ids), b * rows, seq.cache.pages
            assert 0 < n <= rows and seq.cache.capacity >= seq.cached + rows
            positions = range(seq.cached, seq.cached + rows)
            meta[0, at: at + n] = torch.tensor(ids)
            meta[1, at: at + rows] = torch.tensor(positions)
            meta[2, at: at + rows] = torch.tensor([pages[p // page] * page + p % page
                                                   for p in positions])
            chunk[:, b] = torch.tensor([at, rows, seq.cached, n])
        core = self.core
        core.meta[:, : B * rows].copy_(meta, non_blocking=True)
        self.chunk[:, :B].copy_(chunk, non_blocking=True)
        core.tables.fill([seq.cache for seq in seqs])

    def step(self, batch: int, rows: int) -> torch.Tensor:
        """Logits [batch, V] after each loaded chunk's last real token; their K/V stored."""
        offset, length, start, valid = (r[:batch] for r in self.chunk)
        table = self.core.table[:batch]

        def attend(q, k_pages, v_pages):
            return paged_prefill_varlen_triton(q, k_pages, v_pages, table, offset, length, start,
                                               rows, q.shape[-1] ** -0.5)
        h = self.core.hidden_rows(batch * rows, attend)
        return self.core.logits(h.index_select(0, (offset + valid - 1).long()))

    def save_state(self, batch: int) -> Callable[[], None]:
        """Nothing to save: the step's K/V writes are the same when it runs again."""
        return lambda: None
