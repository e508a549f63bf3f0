"""`MtpRound`: `--spec mtp`'s draft rounds replayed as CUDA graphs (`models.mtp_step.MtpStep`).

Drafting eagerly, a round of k = 3 drafts launched the head's kernels one by one: 13.2 ms a
verify step on the H200's 35B-A3B against 5.7 ms of kernels (h200-verify-round.md), which made
`--spec mtp` slower than plain decoding there. One graph per (batch size, context bucket),
captured at load for the buckets the decode graphs captured (`capture_at_start`) and otherwise
the first time that shape runs; graphs read the pool tensors they were captured with, so when
an elastic pool grows into new tensors they are dropped and captured again.

A pair runs at the target's rotary position (`pair_positions`: a media prompt's MRoPE positions,
model-math.md §3.1); the round adds a shift to each position, so it takes rows whose pairs have
no media placeholder among their positions and tokens (so one position on every axis, and
token embeddings).
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

from ..kernels.paged_attention import PAGE
from ..kv import KvStorage, PageTables
from ..models.mtp_step import MtpStep
from ..models.qwen3_5_engine_step import pool_layer
from .decode_graphs import context_bucket
from .graph_capture import record_graph

log = logging.getLogger("ninfer.engine")


def media_of(seq):
    """`seq`'s media layout (`vision.prompt.MediaPrompt`), or None (a text request)."""
    return getattr(getattr(seq, "request", None), "media", None)


def rope_delta_of(seq) -> int:
    """What past its prompt `seq`'s rotary positions add to the position (media: its delta)."""
    return getattr(seq, "rope_delta", 0)


def pair_positions(seq, start: int, n: int) -> torch.Tensor | None:
    """The target's rotary positions of `seq`'s positions start .. start+n-1, [3, n] (a media
    prompt's MRoPE positions; past its prompt, position + rope delta on every axis), or None
    where the request has no media (position t itself)."""
    media = media_of(seq)
    return None if media is None else media.positions_for(start, n)


def pair_shifts(seq, start: int, n: int) -> list[int] | None:
    """`pair_positions` as shifts of positions start .. start+n-1 (zeros without media), or
    None where one is a media placeholder's (its own MRoPE position and vision embedding)."""
    media = media_of(seq)
    if media is None:
        return [0] * n
    if media.spans_in(start, n):
        return None
    return (media.positions_for(start, n)[0] - torch.arange(start, start + n)).tolist()


class MtpRound:
    """Draft rounds of `k` drafts for up to `max_batch` rows of `head` (`models.mtp.MtpHead`),
    whose MTP layer is attention layer `layer` of `storage` (`mtp_drafter`), drafting over
    `draft_head`'s shortlist where given (`--lm-head-draft`)."""

    def __init__(self, head, head_matrix, storage: KvStorage, layer: int, max_batch: int,
                 max_context: int, k: int, vocab: int, capture: bool,
                 draft_head=None) -> None:
        self.storage, self.layer, self.k = storage, layer, k
        self.max_batch, self.max_context, self.capture = max_batch, max_context, capture
        self.step = MtpStep(head, head_matrix, max_batch, -(-max_context // PAGE), self._kv,
                            k + 1, k, vocab, draft_head)
        self.q = self.step.q  # committed pairs a row: after a verify row, 1 .. k + 1
        self.tables = PageTables(self.step.table)
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._bound = storage.k[layer]

    def _kv(self):
        return pool_layer(self.storage, self.step.w.model.embedding.dtype, self.layer)

    def takes(self, seqs: list, lasts: list[int]) -> bool:
        """Whether the round can draft for these rows, each at its first draft position
        `lasts[i]`: few enough rows, each one's pages leased through L + k (the round writes
        K/V up to position L + k - 1), and no media placeholder among the positions and
        tokens of its last `q` pairs and the padding after them."""
        return 0 < len(seqs) <= self.max_batch and all(
            seq.cache.capacity >= last + self.k
            and pair_shifts(seq, max(last - self.q, 0), min(last, self.q) + self.q + 1)
            is not None for seq, last in zip(seqs, lasts))

    def propose(self, seqs: list, pairs: list[tuple[list[int], torch.Tensor, int]],
                ahead: int = 0) -> list[list[int]]:
        """`k` drafts for each row of `seqs` from its committed `pairs` (tokens x_{j+1},
        hiddens h_j, first position j: at most `q`, ending at position L - 1); `ahead`:
        positions past the rows' reach the context bucket covers (a start-up capture's)."""
        s = self.step
        # each row's rotary shifts: its q pair rows' (padding continues), then its drafts'
        shifts = [(pair_shifts(seq, first, self.q), rope_delta_of(seq))
                  for seq, (_, _, first) in zip(seqs, pairs)]

        def load():
            s.load(pairs, shifts)
            self.tables.fill([seq.cache for seq in seqs])
        load()
        batch = len(seqs)
        reach = ahead + max(first + max(self.q, len(tokens) + self.k)
                            for tokens, _, first in pairs)
        bucket = context_bucket(reach, self.max_context)
        if not self.capture:
            return s.round(batch, bucket).tolist()
        if self.storage.k[self.layer] is not self._bound:  # an elastic pool grew
            self._graphs.clear()
            self._pool = torch.cuda.graph_pool_handle()
            self._bound = self.storage.k[self.layer]
        key = (batch, bucket)
        if key not in self._graphs:
            self._graphs[key] = record_graph(lambda: s.round(batch, bucket), self._pool)
            log.info("captured the MTP draft round's CUDA graph for batch %d, context ≤ %d",
                     batch, bucket)
            load()  # the warm-up's draft steps rewrote the first rows' inputs
        graph, drafts = self._graphs[key]
        graph.replay()
        return drafts.tolist()

    def capture_at_start(self, buckets: tuple[int, ...] = ()) -> None:
        """Capture `buckets` (default: the first context bucket) for every batch size now, on
        scratch rows of one pool page that goes back after (their K/V writes are garbage
        nobody reads); a round reaches a bucket through `ahead` alone."""
        cache = self.storage.new_cache()
        try:
            if not cache.reserve(self.q + self.k):
                return
            H = self.step.hidden_in.shape[1]
            hidden = self.step.hidden_in.new_zeros(self.q, H)
            reach = self.q + self.k  # a scratch row's, its pairs at positions 0 .. q - 1
            for bucket in buckets or (context_bucket(reach, self.max_context),):
                for batch in range(1, self.max_batch + 1):
                    seqs = [SimpleNamespace(cache=cache)] * batch
                    self.propose(seqs, [([0] * self.q, hidden, 0)] * batch,
                                 ahead=bucket - reach)
        finally:
            cache.release()
