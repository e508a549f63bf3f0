"""`ninfer bench`'s subject: the serving `Engine` over a model drawn on the device, stepped by
the bench itself.

`bench_engine(model, arch, ...)` wraps the model in `Engine` as `ninfer-serve` does (memory plan,
CUDA graphs captured at start, scheduler, runner, sampler, stats), with the synthetic
architecture's real Qwen tokenizer and chat template (`SyntheticResources`). `run_requests`
submits greedy requests with random prompts and calls `Engine.step` — the engine thread's own
loop turn: schedule → forward → sample → update, events handed over, stats published — timing
each call, so a figure here is what a server with no HTTP in front of it would decode.
The speculative benchmark's drafters, a chosen number of drafts taken a round, are in
`forced_drafts`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..artifact import qwen_resources
from ..artifact.synth import ARCHS, mtp_component
from ..config import PAGE_TOKENS, EngineConfig
from ..engine import Engine
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
