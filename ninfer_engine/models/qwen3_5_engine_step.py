"""`EngineHybridDecoder`: the hybrid family's decode step (`qwen3_5_step.HybridStep`) bound to
the engine's shared KV pool and running-state pool, for `step.decode_graphs.DecodeGraphs`;
`EngineHybridPrompt`: its short-prompt step (`qwen3_5_prompt_step.PromptStep`) bound the same
way."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..kernels.paged_attention import PAGE
from ..kernels.sampling import argmax
from ..kv import KvStorage, PageTables, StatePool
from ..codecs.kv import PlainCodec
from .attention import input_token
from .qwen3_5_prompt_step import PromptStep
from .qwen3_5_step import HybridStep
from .qwen3_5_step_weights import HybridWeights, KvLayer


def pool_layers(storage: KvStorage, dtype: torch.dtype) -> list[KvLayer]:
    """Each attention layer of the engine's shared pool as the step's kernels read and write
    it (where K and V are plain rows of the activation dtype, the q/k kernel stores them)."""
    return [pool_layer(storage, dtype, j) for j in range(len(storage.k))]


def pool_layer(storage: KvStorage, dtype: torch.dtype, j: int) -> KvLayer:
    """Attention layer `j` of the pool as `pool_layers` gives it."""
    s = storage
    k, v = s.k[j], s.v[j]

    def write(slots, new_k, new_v):
        s.k_codec.write(s.k[j], slots, new_k)
        s.v_codec.write(s.v[j], slots, new_v)

    plain = all(isinstance(c, PlainCodec) and c.dtype == dtype for c in (s.k_codec, s.v_codec))
    return KvLayer(s.page_view(k), s.page_view(v), None, None, write,
                   (k[0], v[0]) if plain else None)


def save_slots(core: HybridStep, batch: int) -> Callable[[], None]:
    """A copy of the GDN states in the step's first `batch` loaded slots; calling the result
    puts it back (around a capture's warm-up, which advances them)."""
    slots = core.slots[:batch]
    pools = [*core.conv, *core.ssm]
    copies = [t[slots] for t in pools]

    def restore():
        for t, saved in zip(pools, copies):
            t.index_copy_(0, slots, saved)
    return restore


def _expert_tiers(core: HybridStep):
    """The step's model's offloaded experts (`experts.ExpertTiers`), None where it has none."""
    return getattr(core.w.model, "expert_tiers", None)


class EngineHybridDecoder:
    """`HybridStep` over the engine's shared KV pool and running-state pool, for
    `decode_graphs.DecodeGraphs`: `load` writes each row's token, position, state slot and page
    table into the step's buffers; the step updates every row's state in its slot in place, so
    nothing is copied back."""

    def __init__(self, model, storage: KvStorage, states: StatePool, max_batch: int,
                 max_context: int, max_q: int = 1, keep_hidden: bool = False) -> None:
        self.storage, self.max_batch, self.max_context = storage, max_batch, max_context
        self.max_q = max_q
        self.core = HybridStep(HybridWeights(model, model.params), max_batch,
                               -(-max_context // PAGE), self._kv,
                               (states.field("conv"), states.field("ssm")), max_q, keep_hidden)
        self.tables = PageTables(self.core.table)
        self._slots: list[int] = []  # the loaded rows' state slots
        # every layer's state rows at once, for a rollback by device index (`keep_on_device`)
        self.core.state_stacks = (states.stack("conv"), states.stack("ssm"))
        dev = model.embedding.device
        self._kept = (torch.zeros(max_batch, dtype=torch.long, device=dev)
                      if dev.type == "cuda" and max_q > 1 else None)  # `keep_rows`' counts
        # a verify step's argmax of each token row, where the rows may be accepted on the
        # device (`step.verify_chain`, `--spec mtp`: final-normed hiddens kept, no tap layers'
        # as `--spec dflash` keeps; the same argmax the host's acceptance takes)
        self.picks = (torch.zeros(max_batch * max_q, dtype=torch.long,
                                  device=model.embedding.device)
                      if max_q > 1 and keep_hidden and not self.core.taps else None)

    @property
    def hidden(self) -> torch.Tensor | None:
        """The last step's final-normed hidden per token row (row b · q_len + i), or with the
        model's `feature_taps` its tap layers' residual outputs side by side, or None when the
        step was built without them."""
        return self.core.hidden

    def _kv(self) -> list[KvLayer]:
        return pool_layers(self.storage, self.core.w.model.embedding.dtype)

    def load(self, seqs, drafts: list[list[int]] | None = None) -> None:
        """Each row's tokens (its last output, then its drafts), their positions and rotary
        shift, its state slot and page table; first, the last step's expert routing read."""
        c = self.core
        c.before_step()
        rows = [[input_token(seq), *(drafts[b] if drafts else ())] for b, seq in enumerate(seqs)]
        tokens = [t for row in rows for t in row]
        self._slots = [seq.state.index for seq in seqs]
        # one tensor of four lists (a tensor a row of it was five host calls a step)
        meta = torch.tensor([
            tokens,
            [seq.cached + t for seq, row in zip(seqs, rows) for t in range(len(row))],
            self._slots + [0] * (len(tokens) - len(seqs)),
            [seq.rope_delta for seq, row in zip(seqs, rows) for _ in row]])
        # not waiting for the work queued before (a lookahead step loads behind one in flight)
        c.meta[:, : meta.shape[1]].copy_(meta, non_blocking=True)
        self.tables.fill([seq.cache for seq in seqs])

    def feed(self, tokens: torch.Tensor) -> None:
        """The loaded decode rows' input tokens from the device (the last step's picks)."""
        self.core.meta[0, : tokens.shape[0]].copy_(tokens)

    def step(self, batch: int, bucket: int, q_len: int = 1) -> torch.Tensor:
        logits = self.core.step(batch, bucket, q_len).float()
        if q_len > 1 and self.picks is not None:
            self.picks[: batch * q_len].copy_(argmax(logits))
        return logits

    def keep(self, row: int, kept: int) -> None:
        self.core.keep(row, kept, self._slots[row])

    def keep_rows(self, back: list[tuple[int, int]]) -> None:
        """Rows of the last verify step, each (row, kept), go back to their state after their
        first kept tokens. On CUDA every row and layer at once, one launch a field
        (`HybridStep.keep_on_device`), where `keep` is a multi-tensor copy of every layer's
        views a row (60 on the 35B-A3B), host time the GPU waits for (~0.1 ms a row over 12
        views under cProfile on the H100, `h100-issue-bounds.json`)."""
        if self._kept is None:
            for row, kept in back:
                if kept < self.max_q:  # (a row keeping every token: nothing moves)
                    self.keep(row, kept)
            return
        rows = 1 + max(row for row, _ in back)
        kept = [self.max_q] * rows  # (max_q: the row keeps every token, nothing moves)
        for row, n in back:
            kept[row] = n
        self._kept[:rows].copy_(torch.tensor(kept), non_blocking=True)
        self.core.keep_on_device(self._kept[:rows], rows)

    def after_launch(self) -> None:
        """The step is queued: the expert tiers' bookkeeping runs while it computes."""
        self.core.after_launch()

    @property
    def generation(self) -> int:
        """Changes when lending reallocates the expert slot stacks (graphs read the old)."""
        tiers = _expert_tiers(self.core)
        return 0 if tiers is None else tiers.generation

    @property
    def graph_form(self) -> int:
        """Which form of the step a graph captures now: 1 where `auto`'s hand-off policy has
        taken the expert hand-off out of it (`experts.handoff_policy`), else 0."""
        tiers = _expert_tiers(self.core)
        policy = None if tiers is None else tiers.handoff
        return int(policy is not None and not policy.on)

    def save_state(self, batch: int) -> Callable[[], None]:
        """A copy of the loaded rows' GDN states; calling the result puts it back (around a
        capture's warm-up, which advances them)."""
        return save_slots(self.core, batch)


class EngineHybridPrompt:
    """`PromptStep` over the engine's shared KV pool and running-state pool: `load` writes up
    to `max_batch` sequences' next prompt tokens (each chunk padded to one row count),
    positions, state slots and page tables into the step's buffers; `step(batch, rows)`
    prefills them in their slots and pages in place. Shares the decoder's `HybridWeights`;
    `hidden` as the decoder's (`keep_hidden`)."""

    def __init__(self, weights: HybridWeights, storage: KvStorage, states: StatePool,
                 max_batch: int, max_context: int, rows: int, keep_hidden: bool = False) -> None:
        self.storage, self.max_batch, self.rows = storage, max_batch, rows
        self.core = PromptStep(weights, max_batch, -(-max_context // PAGE), self._kv,
                               (states.field("conv"), states.field("ssm")), rows, keep_hidden)
        self.tables = PageTables(self.core.table)

    @property
    def hidden(self) -> torch.Tensor | None:
        """The last step's hidden per token row (chunk b's from row b · rows), or None."""
        return self.core.hidden

    def _kv(self) -> list[KvLayer]:
        return pool_layers(self.storage, self.core.w.model.embedding.dtype)

    def load(self, seqs, tokens: list[list[int]], rows: int) -> None:
        """`tokens[b]`, sequence b's prompt from its `cached` on, padded to `rows` (each
        lease must cover `cached + rows` positions: the padding rows' K/V go there)."""
        c, B = self.core, len(seqs)
        assert 0 < B <= self.max_batch and rows <= self.rows
        meta = torch.zeros(4, B * rows, dtype=torch.long)
        chunk = torch.zeros(4, B, dtype=torch.int32)
        for b, (seq, ids) in enumerate(zip(seqs, tokens)):
            n, at = len(ids), b * rows
            assert 0 < n <= rows and seq.cache.capacity >= seq.cached + rows
            meta[0, at: at + n] = torch.tensor(ids)
            meta[1, at: at + rows] = torch.arange(seq.cached, seq.cached + rows)
            meta[2, b] = seq.state.index
            meta[3, at: at + rows] = seq.rope_delta
            chunk[:, b] = torch.tensor([at, rows, seq.cached, n])
        c.meta[:, : B * rows].copy_(meta, non_blocking=True)
        c.chunk[:, :B].copy_(chunk, non_blocking=True)
        self.tables.fill([seq.cache for seq in seqs])

    def step(self, batch: int, rows: int) -> torch.Tensor:
        return self.core.prefill(batch, rows).float()

    def save_state(self, batch: int) -> Callable[[], None]:
        return save_slots(self.core, batch)
