"""A short prompt chunk of one sequence as one step over static buffers, for CUDA graphs.

An agent's turn over a cached prefix computes a few dozen new tokens over a long context: the
eager forward spends ~18 ms of host time on the 8-layer 35B-A3B shape for ~5 ms of kernels
(h200-host-tier-ttft-35b-a3b-python-profile.txt). `PromptStep` is `qwen3_5_step.HybridStep`'s
layer loop over one sequence's chunk padded to a fixed row count (`rows`), so the whole step is
one fixed sequence of kernels whatever the chunk's length (up to `rows`) and context:

- GDN layers walk the chunk's tokens in order in the state's slot (`kernels.gdn_decode`,
  `gdn_fused` with `valid`: the padding rows are convolved and walked, the slot keeps the state
  after the last real token);
- attention layers store every row's K/V at its position in the sequence's own pages (the
  padding rows' past the chunk, which the tokens after it overwrite before anything reads
  them: the caller makes sure the lease covers `rows` positions) and attend with the varlen
  `kernels.paged_prefill` kernel, its start read from the device (its pages split over the SMs);
- MoE layers run the eager forward's sorted dispatch (`SparseMoE.__call__`: the grouped
  kernels, no host sync where `SparseMoE.capturable`);
- the head reads the last real token's row only.

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
    """One sequence's prompt chunk of up to `rows` tokens (its state in slot `slots[0]`, its
    pages in `table[0]`): `load` fills `tokens`, `pos` (the chunk's positions, padding rows
    continuing them), `slots`, `shift` and `chunk`; `prefill(rows)` returns the logits [1, V]
    after its last real token (and, built with `keep_hidden`, leaves each row's hidden in
    `hidden`, as `HybridStep` does: a drafter's features)."""

    def __init__(self, weights: HybridWeights, max_pages: int, kv: Callable[[], list[KvLayer]],
                 states: tuple[list[torch.Tensor], list[torch.Tensor]], rows: int,
                 keep_hidden: bool = False):
        # the GEMVs' fp32 sums for up to GEMV_MAX_ROWS rows (more take cuBLAS; the MoE layers
        # their own dispatch), no rollback trail; `hidden` as the decode step keeps it
        super().__init__(weights, 1, max_pages, kv, states, max_q=rows,
                         keep_hidden=keep_hidden, trail=False, acc_rows=GEMV_MAX_ROWS)
        dev = self.meta.device
        # int32 [4, 1]: the varlen attention's q offset (0), q length (the padded rows: every
        # row attends) and start (the chunk's first position); the real tokens (GDN `valid`)
        self.chunk = torch.zeros(4, 1, dtype=torch.int32, device=dev)
        self.valid = self.chunk[3]
        self.last = torch.zeros(1, dtype=torch.long, device=dev)  # the last real token's row

    def prefill(self, rows: int) -> torch.Tensor:
        """Logits [1, V] after the loaded chunk's last real token; its K/V and GDN state
        stored. `rows` (≤ the step's) token rows run, the chunk padded to them."""
        pos = self.pos[:rows]
        slot = self.table[0, pos // PAGE] * PAGE + pos % PAGE
        y = self.layers(rows, 1, rows, self.table[:1], None, slot)
        return self.w.head(y.index_select(0, self.last))

    def _attn(self, layer, kv: KvLayer, y, pos, rope, table, kv_span, slot, acc):
        m, n = layer["mixer"], y.shape[0]
        q, gate = self._qk(layer, kv, y, rope, slot)
        offset, length, start, _ = self.chunk
        a = paged_prefill_varlen_triton(q, kv.k, kv.v, table, offset, length, start, n,
                                        m.d**-0.5, kv.k_scale, kv.v_scale)
        return layer["w_out"](a.reshape(n, m.nq * m.d), gate=gate, act="sigmoid", acc=acc)

    def _moe(self, layer, y, n, router_acc, acc):
        return layer["moe"](y)
