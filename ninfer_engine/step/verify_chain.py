"""`VerifyChain`: `--spec mtp`'s verify round settled on the device, read back once.

Without it the host waits for the device twice a round: for the verify step's logits
(acceptance: the argmax of each position, the longest prefix of drafts it agrees with, the GDN
rollback by the host's counts), then, after loading the committed pairs, for the MTP round's
drafts. With it, one graph queued behind the verify step's does all of that on the device:
each row's accepted count j and bonus token from the verify step's argmax (`picks`), every GDN
layer's rollback to j + 1 tokens (`HybridStep.keep_on_device`), the MTP round's pairs gathered
from the verify step's inputs and hiddens (`MtpStep.load_from_verify`) and its k drafts; the host
reads (j, bonus, drafts) in one copy, emits d_1..d_j and the bonus, and the next step verifies
the drafts it read (`MtpDrafter.propose_rows`). The tokens are the host path's: the same argmax
over the same logits, the same rule.

A step chains when acceptance needs nothing of the host (`takes`): every row greedy without
penalties or grammar (`chainable`), carrying the full k drafts, its drafter's pairs run up to
its last token (`MtpDrafter.ready`) and its pages leased through L + 2k (the round after
j = k writes K/V there). A row the host ends inside the round (an end token among the drafts, a
stop string, the output limit) keeps fewer tokens than the device did: `settle` takes its GDN
state back from the verify step's trail, which the chain leaves as it was. Every op of the chain
is idempotent on its inputs, so the warm-up run before a capture changes nothing the replay does
not set again.
"""
from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

from ..kv.slots import StateSlot
from .decode_graphs import DecodeGraphs, context_bucket, record_graph

log = logging.getLogger("ninfer.engine")


def chainable(seq) -> bool:
    """A row the device can accept for: greedy, no penalties, grammar, log-probabilities or
    forced thinking close (its token is the plain argmax of the verify step's logits)."""
    s = seq.sampler
    p = s.params
    return (p.greedy and p.presence_penalty == 0.0 and p.frequency_penalty == 0.0
            and s.constraint is None and s.logprobs is None and seq.thinking_cap is None)


class VerifyChain:
    """The device tail of verify steps through `graphs` (a hybrid `DecodeGraphs` that keeps
    hiddens and picks) for `speculator`'s MTP drafter (its `round`, `models.mtp_step.MtpStep`
    over the pool's MTP layer); one graph per (batch size, context bucket) when `capture`."""

    def __init__(self, graphs: DecodeGraphs, speculator, capture: bool) -> None:
        d = graphs.decoder
        self.graphs, self.speculator, self.capture = graphs, speculator, capture
        self.core, self.picks, self.k = d.core, d.picks, d.max_q - 1
        self.max_batch, self.max_context = d.max_batch, d.max_context
        dev = self.picks.device
        self.forced = torch.full((self.max_batch,), -1, dtype=torch.long, device=dev)
        # per row: accepted drafts j, the bonus token, the next round's k drafts
        self.out = torch.zeros(self.max_batch, 2 + self.k, dtype=torch.long, device=dev)
        self.host = torch.zeros(self.out.shape, dtype=torch.long,
                                pin_memory=dev.type == "cuda")
        self.event = torch.cuda.Event() if dev.type == "cuda" else None
        self._graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._bound = None  # the MTP layer's K tensor the graphs read (an elastic pool grows)
        self._launched: dict[int, tuple[int, list[int]]] = {}  # id(seq): (row, its drafts)
        self._read: list[list[int]] | None = None

    @property
    def drafter(self):
        return self.speculator.drafter

    def takes(self, seqs: list, drafts: list[list[int]]) -> bool:
        """Whether the verify step of `seqs` with `drafts` chains (see the module docstring)."""
        drafter = self.drafter
        if getattr(drafter, "round", None) is None or not 0 < len(seqs) <= self.max_batch:
            return False
        return all(len(d) == self.k and chainable(seq) and drafter.ready(seq)
                   and seq.cache.capacity > seq.cached + 2 * self.k
                   for seq, d in zip(seqs, drafts))

    def launch(self, seqs: list, drafts: list[list[int]]) -> None:
        """After `graphs.verify(seqs, drafts)` (`takes` said so): the chain queued, its results
        copied to the host behind it; `seqs`' drafter rows get the verify step's hiddens."""
        batch, q = len(seqs), self.k + 1
        counts = getattr(self.drafter, "forced_counts", lambda _: [None] * batch)(drafts)
        self.forced[:batch].copy_(torch.tensor([-1 if c is None else c for c in counts]),
                                  non_blocking=True)
        out = self._run(batch, context_bucket(max(s.cached for s in seqs) + 2 * self.k + 1,
                                              self.max_context))
        self.host[:batch].copy_(out[:batch], non_blocking=True)
        if self.event is not None:
            self.event.record()
        for b, seq in enumerate(seqs):  # h of positions L..L+k, for prefix reuse
            self.drafter.store_rows(seq, seq.cached, self.core.hidden[b * q: (b + 1) * q])
        self._launched = {id(seq): (b, d) for b, (seq, d) in enumerate(zip(seqs, drafts))}
        self._read = None

    def accepted(self, seqs: list) -> list[list[int]]:
        """The tokens each of `seqs` (rows of the launched chain) emits: its first j drafts
        and the bonus. Waits for the chain (the round's one read-back)."""
        results, out = self._results(), []
        for seq in seqs:
            b, d = self._launched[id(seq)]
            j, bonus = results[b][:2]
            out.append([*d[:j], bonus])
        return out

    def settle(self, seqs: list, kept: list[int]) -> None:
        """After the host's acceptance: row i of the launched chain keeps `kept[i]` tokens
        (its GDN state back to them where the device kept more), `cached` advances, and its
        drafter row holds the next round's drafts where it kept what the device did."""
        results = self._results()
        for seq, n in zip(seqs, kept):
            b = self._launched[id(seq)][0]
            j, _, *drafts = results[b]
            if n != j + 1:
                self.graphs.decoder.keep(b, n)
            seq.cached += n
            self.drafter.chained(seq, drafts if n == j + 1 else None)
        self._launched = {}

    def capture_at_start(self) -> None:
        """Capture the first context bucket for every batch size now, behind a verify step of
        scratch rows in state slots 0.. on one pool page that goes back after (nobody holds a
        slot or reads those K/V yet), as `DecodeGraphs.capture_at_start` does."""
        cache = self.graphs.decoder.storage.new_cache()
        try:
            if not cache.reserve(2 * self.k + 2):
                return
            scratch = [SimpleNamespace(cache=cache, cached=0, output=[0], rope_delta=0,
                                       state=StateSlot(i, [])) for i in range(self.max_batch)]
            for batch in range(1, self.max_batch + 1):
                self.graphs.verify(scratch[:batch], [[0] * self.k] * batch)
                self._run(batch, context_bucket(2 * self.k + 1, self.max_context))
        finally:
            cache.release()

    def _run(self, batch: int, bucket: int) -> torch.Tensor:
        step = self.drafter.round.step
        if not self.capture:
            return self._chain(step, batch, bucket)
        bound = self.drafter.round.storage.k[self.drafter.round.layer]
        if bound is not self._bound:  # an elastic pool grew: the graphs read the old tensors
            self._graphs.clear()
            self._pool = torch.cuda.graph_pool_handle()
            self._bound = bound
        key = (batch, bucket)
        if key not in self._graphs:
            self._graphs[key] = record_graph(lambda: self._chain(step, batch, bucket),
                                             self._pool)
            log.info("captured the verify chain's CUDA graph for batch %d, context ≤ %d",
                     batch, bucket)
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def _chain(self, step, batch: int, bucket: int) -> torch.Tensor:
        """The device ops: acceptance, rollback, the MTP round; `out` [max_batch, 2 + k]."""
        q, k = self.k + 1, self.k
        picks = self.picks[: batch * q].view(batch, q)
        drafts = self.core.tokens[: batch * q].view(batch, q)[:, 1:]
        agree = (drafts == picks[:, :k]).long().cumprod(1).sum(1)
        forced = self.forced[:batch]
        accepted = torch.where(forced >= 0, forced, agree)
        bonus = picks.gather(1, accepted[:, None])[:, 0]
        self.core.keep_on_device(accepted + 1, batch)
        step.load_from_verify(self.core, accepted, bonus, batch)
        out = self.out[:batch]
        out[:, 0], out[:, 1] = accepted, bonus
        out[:, 2:] = step.round(batch, bucket)
        return self.out

    def _results(self) -> list[list[int]]:
        """[j, bonus, draft 1, .., draft k] of each launched row."""
        if self._read is None:
            if self.event is not None:
                self.event.synchronize()
            self._read = self.host[: len(self._launched)].tolist()
        return self._read


def verify_chain(graphs: DecodeGraphs | None, speculator) -> VerifyChain | None:
    """The chain for an engine whose `--spec mtp` drafter drafts through a captured round
    over `graphs`' verify step, captured at start; else None."""
    if (graphs is None or speculator is None
            or getattr(speculator.drafter, "round", None) is None
            or getattr(graphs.decoder, "picks", None) is None):
        return None
    chain = VerifyChain(graphs, speculator, graphs.capture)
    if graphs.capture:
        chain.capture_at_start()
    return chain
