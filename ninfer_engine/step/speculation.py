"""Speculative decoding in the step: drafts for decode rows, verification, acceptance counters.

`NgramDrafter` (`--spec ngram`, ours; llama.cpp's and vLLM's prompt lookup) proposes, for a
sequence whose latest tokens repeat an earlier n-gram of its prompt or output, the tokens that
followed that n-gram's latest earlier occurrence: no weights, any model. The runner verifies a
row of the last token and k drafts in one forward (`DecodeGraphs.verify` or the eager forward's
verify rows), and `acceptance` keeps what plain decoding would have given (greedy rows exactly,
sampled rows in distribution). `Speculator` decides per row whether to draft (rows without
log-probabilities, while their acceptance pays) and keeps the counters `EngineStats.spec`
reports. A constrained row's drafts are cut to what its grammar accepts and its verify row is
masked at every position (`grammar_drafts`).

A drafter is model-free, `propose(tokens, k)` (`NgramDrafter`, or any stand-in with that
method), or reads the model, `propose_rows(seqs, ks)` for a step's decode rows at once, fed the
target's hidden states through `observe` (`mtp_drafter.MtpDrafter`, `--spec mtp`; or its tap
layers' features, `dflash_drafter.DFlashDrafter`, `--spec dflash`).
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass, field

import torch

from ..models.mtp import load_mtp
from ..stats import SpecStats
from .dflash_drafter import dflash_drafter
from .grammar_drafts import cut
from .draft_head import load_draft_head
from .mtp_drafter import MtpDrafter
from .sampling import Sampler
from .spec_policy import SpecPolicy

MIN_NGRAM, MAX_NGRAM = 2, 4
# a request stops drafting while its recent acceptance is below this (drafts that are mostly
# rejected cost a verify step's extra tokens for nothing); it retries after `RETRY` rounds
MIN_ACCEPTANCE, RETRY = 0.2, 16
KEPT = 0.7  # the acceptance average's weight on its past (1 - KEPT on the newest round)
# n-gram lookup finding nothing pauses the row 1, 2, 4, ... steps (at most this many) before
# it looks again: its plain steps can then go ahead (`plain_next`), which a row asked every
# step never does on text that does not repeat
MAX_EMPTY_PAUSE = 8


def averaged(acceptance: float, rate: float) -> float:
    """A row's acceptance average after a round that took `rate` of its drafts."""
    return KEPT * acceptance + (1 - KEPT) * rate


class NgramDrafter:
    """Prompt-lookup drafts: the longest n-gram (MAX_NGRAM .. MIN_NGRAM tokens) that ends the
    tokens and occurred before; the k tokens after its latest earlier occurrence. A
    continuation that runs into the tail is copied on from the drafts themselves (a repeating
    stretch goes on repeating), as an LZ77 back-reference would."""

    def propose(self, tokens: list[int], k: int) -> list[int]:
        n_tokens = len(tokens)
        # searched as bytes (C speed): a Python scan took ~0.9 ms a row at 2,000 tokens, each
        # step, whether or not anything matched
        data = array("q", tokens).tobytes()
        for n in range(min(MAX_NGRAM, n_tokens - 1), MIN_NGRAM - 1, -1):
            tail = data[8 * (n_tokens - n):]
            end = 8 * (n_tokens - 1)  # an earlier occurrence ends before the last token
            at = data.rfind(tail, 0, end)
            while at > 0 and at % 8:  # a match across token boundaries: look further back
                at = data.rfind(tail, 0, at + len(tail) - 1)
            if at < 0:
                continue
            drafts: list[int] = []
            source = at // 8 + n
            while len(drafts) < k:
                i = source + len(drafts)
                drafts.append(tokens[i] if i < n_tokens else drafts[i - n_tokens])
            return drafts
        return []


@dataclass
class RowState:
    """A request's drafting record: an acceptance average over its recent rounds."""

    acceptance: float = 1.0
    paused: int = 0  # rounds left before it drafts again
    empty: int = 0  # n-gram lookups in a row that found nothing (`MAX_EMPTY_PAUSE`)


@dataclass
class SpecCounters:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)  # accepted drafts at position i
    fallback: int = 0  # decode rows that did not draft while speculation was on


class Speculator:
    """`--spec` in the engine: drafts for eligible decode rows, and the counters."""

    def __init__(self, backend: str, k: int, drafter=None) -> None:
        if drafter is None and backend != "ngram":
            raise ValueError(f"--spec {backend} is not available yet")
        self.backend, self.k = backend, k
        self.drafter = drafter or NgramDrafter()
        self.reset()

    def reset(self) -> None:
        """Counters, policy timings and row records from zero (after the load's warm-up, whose
        steps compile kernels and are no traffic's)."""
        self.counters = SpecCounters(per_position=[0] * self.k)
        # a fresh one of the policy set (a benchmark's or a test's `AlwaysSpeculate` stays)
        self.policy = type(getattr(self, "policy", SpecPolicy()))()
        self._rows: dict[int, RowState] = {}
        self._decided: int | None = None  # a batch size the policy said drafts (`plain_next`)

    def drafts(self, seq, room: int) -> list[int]:
        """Drafts for `seq`'s next decode row ([] = a plain decode row); `room`: how many
        positions the row may add beyond its one token (context, output limit)."""
        return self.draft_rows([seq], [room])[0]

    def draft_rows(self, seqs: list, rooms: list[int]) -> list[list[int]]:
        """`drafts` for each of a step's decode rows, a model drafter's in one batch; none
        while plain decode steps of this batch size have been the faster (`spec_policy`)."""
        decided, self._decided = self._decided, None
        if decided != len(seqs) and not self.policy.speculate(len(seqs)):
            self._fall_back(seqs)
            return [[] for _ in seqs]
        ks = [self._window(seq, room) for seq, room in zip(seqs, rooms)]
        if hasattr(self.drafter, "propose_rows"):
            proposals = self.drafter.propose_rows(seqs, ks)
        else:
            proposals = [self.drafter.propose([*seq.prompt, *seq.output], k) if k else []
                         for seq, k in zip(seqs, ks)]
        proposals = cut(seqs, proposals)  # constrained rows: what their grammar accepts
        self._fall_back([seq for seq, k, p in zip(seqs, ks, proposals) if k and not p])
        if self.backend == "ngram":
            self._back_off(seqs, ks, proposals)
        return proposals

    def _back_off(self, seqs: list, ks: list[int], proposals: list[list[int]]) -> None:
        """A row whose lookup found nothing pauses 2^(n-1) steps after its n-th empty one in a
        row (at most `MAX_EMPTY_PAUSE`); one that found drafts starts over."""
        for seq, k, drafts in zip(seqs, ks, proposals):
            if k:
                row = self._rows[id(seq)]
                row.empty = 0 if drafts else row.empty + 1
                if row.empty:
                    row.paused = min(1 << (row.empty - 1), MAX_EMPTY_PAUSE)

    def _fall_back(self, seqs: list) -> None:
        """`seqs` decode plainly this step while speculation is on: counted engine-wide and
        on each request (`Timings.draft_fallback`)."""
        self.counters.fallback += len(seqs)
        for seq in seqs:
            seq.draft_fallback += 1

    def _window(self, seq, room: int) -> int:
        """How many drafts `seq` may get this step (0: a plain decode row)."""
        k = min(self.k, room)
        if k <= 0 or not _eligible(seq):
            return 0
        row = self._rows.setdefault(id(seq), RowState())
        if row.paused:
            row.paused -= 1
            self._fall_back([seq])
            return 0
        return k

    def plain_next(self, seqs: list) -> bool:
        """Whether these decode rows' next step decodes plainly (a lookahead step, launched
        before this one is read: `step.lookahead`), asking the policy as `draft_rows` would. A
        step the policy wants drafted (a row not paused for low acceptance) goes through the
        scheduler, and its `draft_rows` takes this answer instead of asking again."""
        if self.policy.speculate(len(seqs)):
            paused = [self._rows.get(id(seq), RowState()).paused for seq in seqs]
            if not all(paused):
                self._decided = len(seqs)
                return False
            for seq in seqs:  # none would draft: a step each of their pause
                self._rows[id(seq)].paused -= 1
        self._fall_back(seqs)
        return True

    def goes_on(self, seqs: list) -> bool:
        """Whether these decode rows will all draft their next step, whatever the round in
        flight accepts (a verify chain's round launched ahead of it: `chain_ahead`): the policy
        drafts at their batch size, none is paused, and none would pause for low acceptance
        were that round to take nothing (an ahead round there verifies what the host path
        would have decoded plainly)."""
        def sure(row: RowState) -> bool:
            return not row.paused and averaged(row.acceptance, 0.0) >= MIN_ACCEPTANCE
        return self.policy.speculate(len(seqs)) and all(
            sure(self._rows.get(id(seq), RowState())) for seq in seqs)

    def record_step(self, batch: int, verified: bool, tokens: int, seconds: float) -> None:
        """A pure decode step of `batch` rows (`verified`: some verified drafts) emitted
        `tokens` in `seconds`, drafting included."""
        self.policy.record(batch, verified, tokens, seconds)

    @property
    def reads_hidden(self) -> bool:
        """Whether the drafter drafts from the target's hiddens (the runner then hands them
        over: `observe`)."""
        return hasattr(self.drafter, "observe")

    def observes(self, seq) -> bool:
        """Whether `observe` hands `seq`'s hiddens to the drafter (rows that never draft keep
        none, unless the drafter keeps rows with their pages: `dflash_drafter`, `mtp_drafter`; a
        tensor-parallel plan tells the other ranks)."""
        keeps = getattr(self.drafter, "keeps_rows", None)
        return hasattr(self.drafter, "observe") and (
            _eligible(seq) or (keeps is not None and keeps(seq)))

    @property
    def page_rows(self) -> int:
        """The width of the row a position's KV page slot keeps for the drafter (0: none)."""
        return getattr(self.drafter, "page_rows", 0)

    def bind_step(self, storage, graphs) -> None:
        """The pool and the decode graphs, once built, to a drafter that runs a step of its
        own on them (`MtpDrafter.bind_step`)."""
        bind = getattr(self.drafter, "bind_step", None)
        if bind is not None:
            bind(storage, graphs)

    @property
    def kv_layers(self) -> int:
        """Attention layers of the drafter's own in the KV pool, after the model's (`--spec
        mtp`: 1); a row's lease covers its drafts before it drafts (they write there)."""
        return getattr(self.drafter, "kv_layers", 0)

    def context_bytes(self, positions: int) -> int:
        """The most device bytes the drafter holds for one sequence of `positions`, beyond
        the KV pool (`--kv-capacity auto`)."""
        of = getattr(self.drafter, "context_bytes", None)
        return of(positions) if of is not None else 0

    def observe(self, seq, position: int, hidden: torch.Tensor) -> None:
        """The runner's final-normed hiddens of `seq` from `position` on, for a drafter that
        reads them."""
        if self.observes(seq):
            self.drafter.observe(seq, position, hidden)

    def proposal(self, seq) -> list | None:
        """The proposal distributions of `seq`'s drafts being verified (a drafter that samples
        them: DFlash2's walk), or None for point-mass drafts."""
        take = getattr(self.drafter, "proposal", None)
        return take(seq) if take is not None else None

    def record(self, seq, drafted: int, accepted: int) -> None:
        """One verified row: `accepted` of its `drafted` drafts were taken."""
        c = self.counters
        c.rounds += 1
        c.drafted += drafted
        c.accepted += accepted
        for i in range(accepted):
            c.per_position[i] += 1
        row = self._rows.setdefault(id(seq), RowState())
        row.acceptance = averaged(row.acceptance, accepted / drafted)
        if row.acceptance < MIN_ACCEPTANCE:
            row.paused, row.acceptance = RETRY, MIN_ACCEPTANCE  # retry from the threshold

    def forget(self, seq) -> None:
        self._rows.pop(id(seq), None)
        if hasattr(self.drafter, "forget"):
            self.drafter.forget(seq)

    def stats(self) -> SpecStats:
        """The counters as `EngineStats.spec` reports them (per position: acceptance rate)."""
        c = self.counters
        rates = tuple(n / c.rounds if c.rounds else 0.0 for n in c.per_position)
        return SpecStats(self.backend, self.k, c.rounds, c.drafted, c.accepted, rates)


def build_speculator(backend: str, k: int, artifact, model, vocab: int,
                     matmul_dtype: torch.dtype | None = None,
                     lm_head_draft: bool = False) -> Speculator:
    """`--spec backend` with `k` drafts a row: prompt-lookup drafts, or drafts from the
    artifact's MTP head over `model` (argmax over the tokenizer's `vocab` ids, or over the
    artifact's proposal shortlist with `lm_head_draft`), or from its DFlash or DFlash2 drafter
    (`dflash`, `dflash2`)."""
    if backend in ("dflash", "dflash2"):
        return Speculator(backend, k, dflash_drafter(artifact, model, vocab, matmul_dtype,
                                                     backend, k))
    if backend != "mtp":
        return Speculator(backend, k)
    return Speculator(backend, k, mtp_drafter(artifact, model, vocab, matmul_dtype,
                                              lm_head_draft))


def mtp_drafter(artifact, model, vocab: int, matmul_dtype: torch.dtype | None = None,
                lm_head_draft: bool = False) -> MtpDrafter:
    """The drafter over the artifact's MTP head (its share under tensor parallelism: every
    rank builds one, `parallel.follower`, with the same `--lm-head-draft`)."""
    head = load_mtp(artifact, model, model.device, model.dtype, matmul_dtype)
    vocab = min(vocab, model.vocab_size)
    shortlist = (load_draft_head(artifact, model.head_projection.weight, vocab, model.device,
                                 model.dtype) if lm_head_draft else None)
    return MtpDrafter(head, vocab, shortlist)


def _eligible(seq) -> bool:
    """Rows whose verification reproduces plain decoding exactly (greedy) or in distribution
    (sampled): no log-probabilities, no forced thinking-close tokens (a grammar is masked at
    every verified position, `grammar_drafts`)."""
    s: Sampler = seq.sampler
    return s.logprobs is None and seq.thinking_cap is None
