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
over the same logits, the same rule (`chain_accept`); a sampled row's, the same rejection test
and draw over the same candidates with the same uniforms, drawn at launch.

A step chains when acceptance needs nothing of the host (`takes`): every row greedy or
sampled through the top-k path, without grammar (`chainable`; presence and frequency penalties
are applied on the device as the host applies them, `chain_penalties`), carrying the full k
drafts, its drafter's pairs run up to
its last token (`MtpDrafter.ready`) and its pages leased through L + 2k (the round after
j = k writes K/V there). An end token among a row's drafts ends its acceptance there (it goes
out as the bonus: the same tokens as the host's, whose row stops at it), so the device keeps
what the host emits. A row the host ends inside the round anyway (a stop string, the output
limit) keeps fewer tokens than the device did: `settle` takes its GDN state back from the
verify step's trail, which the chain leaves as it was.

The chain also stages the next round's inputs (each row's bonus and drafts at its next
positions, `next`), so the engine may queue that round before reading this one
(`launch_ahead`, where `chain_ahead.ChainAhead` holds); rounds are settled oldest first. Every
op of the chain is idempotent on its inputs, so the warm-up run before a capture changes nothing
the replay does not set again. Drafts can differ from the host path's where the two size the
draft round's attention grid into different context buckets (the chain for j = k); tokens
cannot.
"""
from __future__ import annotations

import logging
from collections import deque
from types import SimpleNamespace

import torch

from ..kernels.sampling import argmax
from ..kv.slots import StateSlot
from .chain_accept import ChainSampling, accept_on_device, samples_on_device
from .chain_penalties import ChainPenalties
from .chain_rounds import ChainRounds, _Round
from .decode_graphs import DecodeGraphs, context_bucket
from .graph_capture import record_graph, start_up_capture
from .sampling_paths import candidate_count

log = logging.getLogger("ninfer.engine")


def chainable(seq) -> bool:
    """A row the device can accept for: greedy, or sampled through the top-k path
    (`chain_accept.samples_on_device`), without grammar, log-probabilities or forced thinking
    close (its logits less its presence and frequency penalties: `chain_penalties`)."""
    s = seq.sampler
    return ((s.params.greedy or samples_on_device(s.params)) and s.constraint is None
            and s.logprobs is None and seq.thinking_cap is None)


def start_keys(served, vocab: int) -> list[tuple[bool, int]]:
    """The (penalized, candidates) chains captured at start: greedy with and without
    penalties, and each of `served`'s settings the device samples."""
    return sorted({(False, 0), (True, 0)} | {(p.penalized, candidate_count(p.top_k, vocab))
                                             for p in served if samples_on_device(p)})


class VerifyChain(ChainRounds):
    """The device tail of verify steps through `graphs` (a hybrid `DecodeGraphs` that keeps
    hiddens and picks) for `speculator`'s MTP drafter (its `round`, `models.mtp_step.MtpStep`
    over the pool's MTP layer); one graph per (batch size, context bucket) when `capture`.
    `eos`: the end tokens that end a row (and its acceptance, `_chain`)."""

    def __init__(self, graphs: DecodeGraphs, speculator, capture: bool,
                 eos: frozenset[int] = frozenset()) -> None:
        d = graphs.decoder
        self.graphs, self.speculator, self.capture = graphs, speculator, capture
        self.core, self.picks, self.k = d.core, d.picks, d.max_q - 1
        self.max_batch, self.max_context = d.max_batch, d.max_context
        dev = self.picks.device
        self.forced = torch.full((self.max_batch,), -1, dtype=torch.long, device=dev)
        self.eos = torch.tensor(sorted(eos) or [-1], dtype=torch.long, device=dev)
        self.stops = torch.zeros(self.max_batch, dtype=torch.bool, device=dev)  # ends at eos
        # per row: accepted drafts j, the bonus token, the next round's k drafts
        self.out = torch.zeros(self.max_batch, 2 + self.k, dtype=torch.long, device=dev)
        # the next round's inputs: [bonus, drafts] and their positions, a row each
        self.next = torch.zeros(2, self.max_batch * (self.k + 1), dtype=torch.long, device=dev)
        # two rounds may be unsettled (one launched ahead of the other): a host copy each
        self._copies = [(torch.zeros(self.out.shape, dtype=torch.long,
                                     pin_memory=dev.type == "cuda"),
                         torch.cuda.Event() if dev.type == "cuda" else None)
                        for _ in range(2)]
        self._rounds: deque[_Round] = deque()
        self._turn = 0  # the host copy the next round takes
        self.rounds = self.ahead = 0  # rounds chained, and of them launched ahead (a bench's)
        self._graphs: dict[tuple[int, int, bool, int],
                           tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.penalties: ChainPenalties | None = None  # with the first logits (their width)
        self.sampling = ChainSampling(self.max_batch, self.k, dev)
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        # the draft round and its MTP layer's K tensor the graphs read (an elastic pool grows)
        self._bound: tuple | None = None

    @property
    def drafter(self):
        return self.speculator.drafter

    def takes(self, seqs: list, drafts: list[list[int]]) -> bool:
        """Whether the verify step of `seqs` with `drafts` chains (see the module docstring)."""
        drafter = self.drafter
        if (getattr(drafter, "round", None) is None or self._rounds
                or not 0 < len(seqs) <= self.max_batch):
            return False
        return all(len(d) == self.k and chainable(seq) and drafter.ready(seq)
                   and seq.cache.capacity > seq.cached + 2 * self.k
                   for seq, d in zip(seqs, drafts))

    def launch(self, seqs: list, drafts: list[list[int]], logits: torch.Tensor) -> None:
        """After `logits = graphs.verify(seqs, drafts)` (`takes` said so): the chain queued,
        its results copied to the host behind it; `seqs`' drafter rows get the verify step's
        hiddens."""
        self.stops[: len(seqs)].copy_(torch.tensor([bool(s.eos_token_ids) for s in seqs]),
                                      non_blocking=True)
        penalized = any(s.sampler.params.penalized for s in seqs)
        candidates = ChainSampling.candidates(seqs, logits.shape[-1])
        if penalized or candidates:  # the logits' static copy (`take`); counts if penalized
            penalties = self._penalties(logits.shape[-1])
            if penalized:
                penalties.load(seqs)
        if candidates:
            self.sampling.load(seqs)
        self._queue(seqs, drafts, max(s.cached for s in seqs), logits, penalized, candidates)
        q = self.k + 1
        for b, seq in enumerate(seqs):  # h of positions L..L+k, for prefix reuse
            self.drafter.store_rows(seq, seq.cached, self.core.hidden[b * q: (b + 1) * q])

    def launch_ahead(self, seqs: list) -> torch.Tensor:
        """The next round of the one launched last (the same rows, none settled yet), its
        verify step fed the chain's device outputs (each row's bonus and drafts at its next
        positions) and its chain behind it; its logits [len(seqs), 1 + k, V]."""
        batch, q = len(seqs), self.k + 1
        n = batch * q
        out = self.graphs.verify_fed(
            seqs, q, lambda: self.core.meta[:2, :n].copy_(self.next[:, :n]), ahead=q)
        before = self._rounds[-1]
        if before.candidates:  # its own uniforms (the stream's next after the round before)
            self.sampling.load(seqs)
        self._queue(seqs, [None] * batch, max(s.cached for s in seqs) + q, out, before.penalized,
                    before.candidates)
        before.ahead = True
        self.ahead += 1
        return out

    def capture_at_start(self, served: tuple = ()) -> None:
        """Capture the decode graphs' start-up context buckets (`DecodeGraphs.start_buckets`;
        without them the first) for every batch size now, behind a verify step of scratch
        rows in state slots 0.. on one pool page that goes back after (nobody holds a slot or
        reads those K/V yet), as `DecodeGraphs.capture_at_start` does: greedy with and without
        penalties, and each of `served`'s sampling settings (the model's presets, what a
        request that sends none samples with) the device can sample."""
        cache = self.graphs.decoder.storage.new_cache()
        buckets = (self.graphs.start_buckets
                   or (context_bucket(2 * self.k + 1, self.max_context),))
        try:
            if not cache.reserve(2 * self.k + 2):
                return
            scratch = [SimpleNamespace(cache=cache, cached=0, output=[0], rope_delta=0,
                                       state=StateSlot(i, [])) for i in range(self.max_batch)]
            for batch in range(1, self.max_batch + 1):
                logits = self.graphs.verify(scratch[:batch], [[0] * self.k] * batch)
                self._penalties(logits.shape[-1])
                for bucket in buckets:
                    for with_penalties, candidates in start_keys(served, logits.shape[-1]):
                        self._run(batch, bucket, with_penalties, candidates)
        finally:
            cache.release()

    def _penalties(self, vocab: int) -> ChainPenalties:
        if self.penalties is None:
            self.penalties = ChainPenalties(self.max_batch, self.k + 1, vocab, self.picks.device)
        return self.penalties

    def _queue(self, seqs: list, drafts: list, longest: int, logits: torch.Tensor,
               penalized: bool, candidates: int) -> None:
        """The chain of the verify step just queued for `seqs` (`longest`: the furthest
        `cached` among them, counting rounds in flight; `logits`: its output; `penalized`:
        some row has penalties; `candidates`: some row samples, over that many), then its
        results' copy."""
        batch = len(seqs)
        counts = getattr(self.drafter, "forced_counts", lambda *_: [None] * batch)(drafts, seqs)
        self.forced[:batch].copy_(torch.tensor([-1 if c is None else c for c in counts]),
                                  non_blocking=True)
        if penalized and drafts[0] is None:  # launched ahead: the counts after the round before
            self.penalties.advance(batch)
        if penalized or candidates:
            self.penalties.take(logits)
        out = self._run(batch, context_bucket(longest + 2 * self.k + 1, self.max_context),
                        penalized, candidates)
        host, event = self._copies[self._turn]
        self._turn ^= 1
        host[:batch].copy_(out[:batch], non_blocking=True)
        if event is not None:
            event.record()
        self._rounds.append(_Round({id(seq): b for b, seq in enumerate(seqs)}, list(drafts),
                                   host, event, penalized=penalized, candidates=candidates))
        self.rounds += 1

    def _run(self, batch: int, bucket: int, with_penalties: bool,
             candidates: int) -> torch.Tensor:
        round_ = self.drafter.round
        if not self.capture:
            return self._chain(round_.step, batch, bucket, with_penalties, candidates)
        bound = (round_, round_.storage.k[round_.layer])
        # an elastic pool grew (the graphs read the old tensors), or the drafter's round is
        # another (a benchmark's free drafts, `benchmark.forced_drafts.FreeDraftRound`)
        if self._bound is None or any(a is not b for a, b in zip(bound, self._bound)):
            self._graphs.clear()
            self._pool = torch.cuda.graph_pool_handle()
            self._bound = bound
        key = (batch, bucket, with_penalties, candidates)
        if key not in self._graphs:
            self._graphs[key] = record_graph(
                lambda: self._chain(round_.step, batch, bucket, with_penalties, candidates),
                self._pool)
            log.info("captured the verify chain's CUDA graph for batch %d, context ≤ %d%s%s",
                     batch, bucket, ", with penalties" if with_penalties else "",
                     f", sampling over {candidates} candidates" if candidates else "")
        graph, out = self._graphs[key]
        graph.replay()
        return out

    def _chain(self, step, batch: int, bucket: int, with_penalties: bool,
               candidates: int) -> torch.Tensor:
        """The device ops: acceptance (an end token among the drafts ends it: it goes out as
        the bonus, so the row keeps what the host emits), rollback, the MTP round, the next
        round's inputs; `out` [max_batch, 2 + k]. `with_penalties`: the picks are the
        penalized logits' and the round's tokens are counted for the next; `candidates`:
        sampled rows draw over that many (`chain_accept.ChainSampling`)."""
        q = self.k + 1
        drafts = self.core.tokens[: batch * q].view(batch, q)[:, 1:]
        first = self.core.pos[: batch * q].view(batch, q)[:, 0]
        ends = (drafts[:, :, None] == self.eos).any(-1) & self.stops[:batch, None]
        if candidates:
            logits = self.penalties.logits_of(drafts, with_penalties)
            picks = argmax(logits.view(batch * q, -1)).view(batch, q)
            accepted, bonus = self.sampling.accept(logits, picks, drafts, self.forced[:batch],
                                                   ends, candidates)
        else:
            picks = (self.penalties.picks(drafts) if with_penalties
                     else self.picks[: batch * q].view(batch, q))
            accepted, bonus = accept_on_device(drafts, picks, self.forced[:batch], ends)
        if with_penalties:
            self.penalties.count(drafts, accepted, bonus)
        self.core.keep_on_device(accepted + 1, batch)
        step.load_from_verify(self.core, accepted, bonus, batch)
        out = self.out[:batch]
        out[:, 0], out[:, 1] = accepted, bonus
        out[:, 2:] = step.round(batch, bucket)
        n = batch * q
        tokens, positions = self.next[0, :n].view(batch, q), self.next[1, :n].view(batch, q)
        tokens[:, 0], tokens[:, 1:] = bonus, out[:, 2:]
        torch.add((first + accepted + 1)[:, None], torch.arange(q, device=drafts.device),
                  out=positions)
        return self.out


def verify_chain(graphs: DecodeGraphs | None, speculator, eos: frozenset[int] = frozenset(),
                 served: tuple = ()) -> VerifyChain | None:
    """The chain for an engine whose `--spec mtp` drafter drafts through a captured round
    over `graphs`' verify step, captured at start (greedy, and `served`'s sampling
    settings); else None."""
    if (graphs is None or speculator is None
            or getattr(speculator.drafter, "round", None) is None
            or getattr(graphs.decoder, "picks", None) is None):
        return None
    chain = VerifyChain(graphs, speculator, graphs.capture, eos)
    if graphs.capture:
        with start_up_capture("the verify chain", chain.picks.device):
            chain.capture_at_start(served)
    log.info("--spec mtp: verify rounds of greedy and top-k-sampled rows accepted and drafted "
             "on the device")
    return chain
