"""`ninfer bench`'s subject: the serving `Engine` over a model drawn on the device, stepped by
the bench itself.

`bench_engine(model, arch, ...)` wraps the model in `Engine` as `ninfer-serve` does (memory plan,
CUDA graphs captured at start, scheduler, runner, sampler, stats), with the synthetic
architecture's real Qwen tokenizer and chat template (`SyntheticResources`). `run_requests`
submits greedy requests with random prompts and calls `Engine.step` — the engine thread's own
loop turn: schedule → forward → sample → update, events handed over, stats published — timing
each call, so a figure here is what a server with no HTTP in front of it would decode.
`OracleDrafter` (the speculative benchmark mode) makes a chosen number of drafts a round be
taken, since random weights accept nothing.
"""

from __future__ import annotations

import dataclasses

import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..artifact import qwen_resources
from ..artifact.synth import ARCHS, mtp_component
from ..config import PAGE_TOKENS, EngineConfig
from ..engine import Engine
from ..step import postprocess
from ..types import EngineState, GenerationRequest, SamplingParams

MARGIN = 2 * PAGE_TOKENS  # room past the longest row: its output, a verify row's drafts


class SyntheticResources:
    """The artifact face `Engine` reads besides the weights: the text config, the real Qwen
    tokenizer and chat template of the architecture's vocabulary; with `mtp_params` (a
    `build_synthetic(..., mtp=True)` source), an `mtp` component whose head `--spec mtp`
    builds from those random weights; with `proposal_rows` too, an indexed proposal of the
    head's first that many rows (`--lm-head-draft`; the real artifacts' is 131,072 rows)."""

    def __init__(self, arch: str, config: dict, mtp_params=None, proposal_rows: int = 0) -> None:
        self.name = f"synth-{arch}"
        self._config = config
        self._resources = qwen_resources.resources(ARCHS[arch][1])
        self._params = mtp_params
        self.components = {"text": {"config": config}}
        if mtp_params is not None:
            self.components["mtp"] = mtp_component(config)
        if proposal_rows:
            self.components["text"]["proposal"] = {"domain": "indexed", "rows": proposal_rows}

    def config(self, component: str) -> dict:
        assert component == "text", component
        return self._config

    def has_resource(self, role: str) -> bool:
        return role in self._resources

    def resource(self, role: str) -> bytes:
        return self._resources[role]

    def has_parameter(self, name: str) -> bool:
        return self._params is not None and (name.startswith("mtp/") or (
            "proposal" in self.components["text"] and name.startswith("proposal/")))

    def parameter(self, name: str, shape: tuple[int, ...], dtype=None) -> torch.Tensor:
        if name == "proposal/token_ids":
            return torch.arange(shape[0])
        if name == "proposal/head":
            c = self._config
            head = "text/token_embedding" if c["tie_word_embeddings"] else "text/output_head"
            return self._params(head, (c["vocab_size"], shape[1]))[: shape[0]]
        return self._params(name, shape)


def bench_engine(model, arch: str, config: dict, max_batch: int, max_context: int,
                 draft_tokens: int = 0, cuda_weights: str = "auto",
                 prefill_chunk: int | None = None, kv_tokens: int | None = None,
                 vision=None, lookahead: bool | None = None,
                 prefix_reuse: bool = False, mtp_params=None,
                 verify_chain: str = "ahead", lm_head_draft: int = 0) -> Engine:
    """`Engine` over `model` for up to `max_batch` rows of up to `max_context` tokens in a pool
    of `kv_tokens` (default: every row at `max_context`; `lookahead`: `EngineConfig`'s); with
    `draft_tokens`, verify rows of
    1 + that many tokens are captured too (`--spec`), their drafts from `speculator.drafter`;
    `vision`: a resident `VisionTower` serving media requests; `prefix_reuse`: keep the
    prefix cache a served engine keeps (off: every prompt is computed whole); `mtp_params`
    (with `draft_tokens`): the engine is `--spec mtp` over the random MTP head they draw, its
    drafter left in place (`ForcedRounds` sets how many of its drafts a round takes);
    `verify_chain`: ahead (`EngineConfig`'s default: rounds accepted on the device, each
    launched before the one before is read), on (not launched ahead) or off (the host
    accepts); `lm_head_draft` (rows, with `mtp_params`): `--lm-head-draft` over a proposal of
    the head's first that many rows."""
    engine_config = EngineConfig(
        artifact=Path(f"synth-{arch}"), max_concurrency=max_batch, max_context=max_context,
        # whole pages per row: a lease is whole pages, so max_batch rows of max_context fit
        kv_capacity=kv_tokens or max_batch * -(-max_context // PAGE_TOKENS) * PAGE_TOKENS,
        max_pending_requests=max(16, max_batch), prefill_chunk=prefill_chunk,
        cuda_weights=cuda_weights, no_prefix_reuse=not prefix_reuse,
        spec=("mtp" if mtp_params is not None else "ngram") if draft_tokens else None,
        draft_tokens=draft_tokens or None, lookahead=lookahead,
        verify_chain=verify_chain != "off", chain_ahead=verify_chain == "ahead",
        lm_head_draft=bool(lm_head_draft))
    engine = Engine(engine_config, SyntheticResources(arch, config, mtp_params, lm_head_draft),
                    model=model, vision=vision)
    if engine.speculator is not None and mtp_params is None:
        engine.speculator.drafter = NoDrafts()  # until a run sets its oracle
    return engine


class NoDrafts:
    """A drafter that proposes nothing: plain decode rows in a `--spec` engine."""

    def propose(self, tokens: list[int], k: int) -> list[int]:
        return []


@dataclass
class Run:
    """What `run_requests` saw: each engine step's seconds, whether every request was running
    past its prompt when it began, the tokens it emitted; each request's first-token time (from
    submission)."""

    step_s: list[float] = field(default_factory=list)
    full_decode: list[bool] = field(default_factory=list)
    emitted: list[int] = field(default_factory=list)
    first_token_s: list[float] = field(default_factory=list)

    def decode_window(self, skip: int) -> tuple[int, float]:
        """(tokens, seconds) over the steps in which every request decoded, after the first
        `skip` of them (graph capture for a new context bucket, clocks settling)."""
        steps = [(n, dt) for n, dt, full in zip(self.emitted, self.step_s, self.full_decode)
                 if full][skip:]
        return sum(n for n, _ in steps), sum(dt for _, dt in steps)


def random_prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[tuple[int, ...]]:
    """`n` distinct prompts of `length` ids below the special tokens (none is an end token)."""
    gen = torch.Generator().manual_seed(seed)
    top = min(vocab, 150_000)
    return [tuple(torch.randint(0, top, (length,), generator=gen).tolist()) for _ in range(n)]


def served_sampling(engine: Engine) -> SamplingParams:
    """What a served request that sends only `temperature: 0` samples with: the model preset's
    other settings (the Qwen3.5 presets carry presence_penalty 1.5), greedy."""
    return dataclasses.replace(engine.sampling_defaults, temperature=0.0)


def run_requests(engine: Engine, prompts: list[tuple[int, ...]], max_tokens: int,
                 sampling: SamplingParams = SamplingParams(temperature=0.0)) -> Run:
    """Requests for `prompts` (greedy unless `sampling` says otherwise), `max_tokens` each (end
    tokens ignored), stepped to the end."""
    run = Run()
    seqs, submitted = [], time.perf_counter()
    for i, prompt in enumerate(prompts):
        request = GenerationRequest(f"bench-{i}", prompt, sampling,
                                    max_tokens=max_tokens, ignore_eos=True)
        seq = engine.add(request, lambda event: None)
        if seq is None:
            raise RuntimeError("the engine refused a benchmark request")
        seqs.append(seq)
    first: list[float | None] = [None] * len(seqs)
    before = 0
    for _ in range(len(prompts) * (max_tokens + sum(map(len, prompts))) + 16):  # bounded
        full = all(s.finish_reason is None and s.prefill_done for s in seqs)
        start = time.perf_counter()
        busy = engine.step()
        now = time.perf_counter()
        if engine.state is EngineState.FAILED:
            raise RuntimeError(f"the engine failed: {engine.snapshot().failure}")
        if not busy:
            break
        after = sum(len(s.output) for s in seqs)
        run.step_s.append(now - start)
        run.full_decode.append(full)
        run.emitted.append(after - before)
        before = after
        for i, s in enumerate(seqs):
            if first[i] is None and s.output:
                first[i] = now - submitted
    unfinished = [s.id for s in seqs if s.finish_reason != "length"]
    if unfinished:
        raise RuntimeError(f"benchmark requests did not run to max_tokens: {unfinished}")
    run.first_token_s = first
    return run


class _ForcedAcceptance:
    """How many drafts each round takes: j ∈ {⌊m⌋, ⌊m⌋ + 1} with mean m = `tokens_per_round`
    − 1, drawn as the round's k drafts are proposed (a round the output limit cuts short
    decodes plainly instead, so every verified round carries k); `forced()` makes the engine's
    acceptance take them."""

    def __init__(self, tokens_per_round: float, k: int, seed: int = 0) -> None:
        if not 1.0 <= tokens_per_round <= 1 + k:
            raise ValueError(f"tokens per round {tokens_per_round} is outside [1, {1 + k}]")
        self.mean_correct, self.k = tokens_per_round - 1, k
        self._rng = random.Random(seed)
        # id(drafts) -> (the drafts, how many the round takes): the list is held so that its
        # id is not reused while the entry lasts (a round whose lease cannot grow drops it)
        self._taken: dict[int, tuple[list[int], int]] = {}

    def _take(self, drafts: list[int]) -> None:
        self._taken[id(drafts)] = (drafts, self._draw())

    def _draw(self) -> int:
        low = int(self.mean_correct)
        return min(self.k, low + (self._rng.random() < self.mean_correct - low))

    @contextmanager
    def forced(self):
        """Within: the engine's acceptance (`postprocess.accept`) runs as usual, then each verify
        row emits its first j drafts and one token more (the last token acceptance chose)."""
        real = postprocess.accept

        def accept(rows):
            emitted = real(rows)
            return [(drafts + out[-1:])[: self._taken.pop(id(drafts))[1] + 1]
                    if id(drafts) in self._taken else out  # a round not forced: as accepted
                    for (_, drafts, *_), out in zip(rows, emitted)]
        postprocess.accept = accept
        try:
            yield
        finally:
            postprocess.accept = real
            self._taken.clear()  # rounds that never reached acceptance


class OracleDrafter(_ForcedAcceptance):
    """The speculative benchmark mode: k drafts a round of which the first j are taken, j drawn
    so that a round averages `tokens_per_round` = 1 + E[j]; `forced()` makes the engine's
    acceptance take exactly those j and one token more. Random weights accept nothing, and a
    continuation recorded by plain decoding does not survive verification: bf16 rounding of a
    four-token verify row differs from a one-token step's, random logits have near-ties and
    random routers flip experts (measured on the H200: 1.08 tokens a round on the 35B-A3B
    shape at a 3.67 target). Forcing the count runs exactly the work of real acceptance — the
    verify forward, the acceptance pass over its logits, the GDN/KV rollback to j — with
    tokens that mean nothing, as every token of a random model. Its drafts are random ids:
    drafting costs nothing here (`ForcedRounds` keeps a model drafter's work)."""

    def __init__(self, tokens_per_round: float, k: int, vocab: int, seed: int = 0) -> None:
        super().__init__(tokens_per_round, k, seed)
        self.vocab = vocab

    def propose(self, tokens: list[int], k: int) -> list[int]:
        if k < self.k:  # a round cut short by the output limit: plain decode, so every
            return []   # verified round carries k drafts
        drafts = [self._rng.randrange(self.vocab) for _ in range(k)]
        self._take(drafts)
        return drafts


class FreeDraftRound:
    """The verify chain's draft round (`MtpRound` in `verify_chain`) with the drafting taken
    out, for `ForcedRounds(..., free_drafts=True)`: the same MTP pool layer, no pairs loaded
    from the verify step, and every round's k drafts one fixed set of random ids a row. A
    chained round then runs what `--spec mtp` serves — the verify step, the device's
    acceptance and GDN rollback, the next round's inputs, launched ahead — less the drafting:
    the verify cost curve of the device-accepted path, as `OracleDrafter` gives the host's.
    (The first round of a request still drafts through the MTP head: its drafter's own round.)"""

    def __init__(self, mtp_round, k: int, seed: int = 0) -> None:
        self.storage, self.layer, self.k = mtp_round.storage, mtp_round.layer, k
        self.step = self  # the chain calls `round.step.load_from_verify` and `.round`
        gen = torch.Generator().manual_seed(seed)
        # (the benchmark's requests ignore end tokens: no draft ends a row's acceptance)
        self.drafts = torch.randint(mtp_round.step.vocab, (mtp_round.max_batch, k),
                                    generator=gen).to(self.storage.device)

    def load_from_verify(self, verify, accepted, bonus, batch: int) -> None:
        """(No pairs: nothing drafts from them.)"""

    def round(self, batch: int, bucket: int) -> torch.Tensor:
        return self.drafts[:batch]


class ForcedRounds(_ForcedAcceptance):
    """A model drafter (`MtpDrafter`: `--spec mtp`) drafting as it serves — its head's forwards,
    its KV, the hiddens it is handed — with the number of its drafts a round takes forced as
    `OracleDrafter`'s: the round costs what a served one does at that acceptance. Everything
    but `propose_rows` is the drafter's own."""

    def __init__(self, drafter, tokens_per_round: float, k: int, seed: int = 0,
                 free_drafts: bool = False) -> None:
        super().__init__(tokens_per_round, k, seed)
        self.drafter = drafter
        if free_drafts:  # the verify chain's rounds without their drafting
            self.round = FreeDraftRound(drafter.round, k, seed)

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)

    def forced_counts(self, drafts: list[list[int] | None], seqs: list) -> list[int | None]:
        """How many of each row's `drafts` its round takes, for acceptance on the device
        (`step.verify_chain`, which `forced()` does not reach; `seqs`: the rows' sequences,
        unused here); None: a round not forced. A round the chain launched from its device
        drafts (None) draws its count now."""
        return [self._draw() if d is None else self._taken.pop(id(d), (None, None))[1]
                for d in drafts]

    def propose_rows(self, seqs: list, ks: list[int]) -> list[list[int]]:
        # fewer than k (a round cut short by the output limit): plain decode, as the oracle's
        proposals = [d if len(d) == self.k else [] for d in self.drafter.propose_rows(seqs, ks)]
        for drafts in proposals:
            if drafts:
                self._take(drafts)
        return proposals
