"""Short prompt chunks of a few sequences as one step over static buffers, for CUDA graphs.

An agent's turn over a cached prefix computes a few dozen new tokens over a long context: the
eager forward spends ~18 ms of host time on the 8-layer 35B-A3B shape for ~5 ms of kernels
(h200-host-tier-ttft-35b-a3b-python-profile.txt). `PromptStep` is `qwen3_5_step.HybridStep`'s
layer loop over B sequences' chunks, each padded to a fixed row count (`rows`), so the whole
step is one fixed sequence of kernels whatever the chunks' lengths (up to `rows`) and contexts,
and several agents' turns in one step read the weights once:

- GDN layers walk the chunk's tokens in order in the state's slot (`kernels.gdn_decode`,
  `gdn_fused` with `valid`: the padding rows are convolved and walked, the slot keeps the state
  after the last real token);
- attention layers store every row's K/V at its position in the sequence's own pages (the
  padding rows' past the chunk, which the tokens after it overwrite before anything reads
  them: the caller makes sure the lease covers `rows` positions) and attend with the varlen
  `kernels.paged_prefill` kernel, its start read from the device (its pages split over the SMs);
- MoE layers run the eager forward's sorted dispatch (`SparseMoE.__call__`: the grouped
  kernels, no host sync where `SparseMoE.capturable`);
- the head reads each chunk's last real row only.

The engine binds it to the shared KV pool and state slots (`qwen3_5_engine_step.
EngineHybridPrompt`); `step.decode_graphs.DecodeGraphs.prefill` captures and replays it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..kernels.paged_attention import PAGE
from ..kernels.paged_prefill import paged_prefill_varlen_triton
from .packed import GEMV_MAX_ROWS
from .qwen3_5_step import HybridStep
from .qwen3_5_step_weights import HybridWeights, KvLayer


def prompt_capturable(model) -> bool:
    """Whether every layer of the model's prompt step runs without a host sync (so a CUDA graph
    can hold it): one rank, and each MoE layer's dispatch capturable."""
    if model.ranks.parallel:
        return False
    return all(getattr(block.ffn, "capturable", lambda: True)() for block in model.blocks)


class PromptStep(HybridStep):
    """Up to `max_batch` sequences' prompt chunks, each of up to `rows` tokens, in one step
    (sequence b's state in slot `slots[b]`, its pages in `table[b]`, its chunk padded to the
    step's row count and its token rows starting at b · rows): `load` fills `tokens`, `pos`
    (each chunk's positions, its padding rows continuing them), `slots`, `shift` and `chunk`;
    `prefill(batch, chunk_rows)` returns the logits [batch, V] after each chunk's last real
    token (and, built with `keep_hidden`, leaves each row's hidden in `hidden`, as
    `HybridStep` does: a drafter's features)."""

    def __init__(self, weights: HybridWeights, max_batch: int, max_pages: int,
                 kv: Callable[[], list[KvLayer]],
                 states: tuple[list[torch.Tensor], list[torch.Tensor]], rows: int,
                 keep_hidden: bool = False):
        # the GEMVs' fp32 sums for up to GEMV_MAX_ROWS rows (more take cuBLAS; the MoE layers
        # their own dispatch), no rollback trail; `hidden` as the decode step keeps it
        super().__init__(weights, max_batch, max_pages, kv, states, max_q=rows,
                         keep_hidden=keep_hidden, trail=False, acc_rows=GEMV_MAX_ROWS)
        dev = self.meta.device
        # int32 [4, max_batch], per chunk: the varlen attention's q offset (b · rows), q length
        # (the padded rows: every row attends) and start (the chunk's first position); its
        # real tokens (the GDN kernels' `valid`)
        self.chunk = torch.zeros(4, max_batch, dtype=torch.int32, device=dev)
        self.valid = self.chunk[3]

    def prefill(self, batch: int, chunk_rows: int) -> torch.Tensor:
        """Logits [batch, V] after each loaded chunk's last real token; their K/V and GDN
        states stored. `batch` chunks of `chunk_rows` (≤ the step's) token rows each run."""
        n = batch * chunk_rows
        pos = self.pos[:n]
        seq = self.rows[:n] // chunk_rows  # each token row's chunk
        slot = self.table[seq, pos // PAGE] * PAGE + pos % PAGE
        y = self.layers(n, batch, chunk_rows, self.table[:batch], None, slot)
        last = (self.chunk[0, :batch] + self.valid[:batch] - 1).long()  # each last real row
        return self.w.head(y.index_select(0, last))

    def _attend(self, q, kv: KvLayer, pos, table, kv_span):
        """Each chunk's rows over its pages up to their positions: the varlen prefill kernel,
        its chunks' offsets, lengths and starts read from `chunk`."""
        offset, length, start, _ = self.chunk
        return paged_prefill_varlen_triton(q, kv.k, kv.v, table, offset, length, start,
                                           q.shape[0] // table.shape[0], q.shape[-1] ** -0.5,
                                           kv.k_scale, kv.v_scale)

    def _moe(self, layer, y, n, router_acc, acc):
        return layer["moe"](y)
