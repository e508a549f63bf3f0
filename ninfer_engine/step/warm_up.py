"""Prompt steps run once at startup, so the first burst of traffic does not compile kernels.

The decode and verify steps are CUDA graphs captured at load (`DecodeGraphs.capture_at_start`);
a step with prompt chunks runs the eager forward, whose Triton kernels compile on first use of
each specialisation: one prompt, several prompts in one step (varlen), a chunk over a prompt's
earlier chunk, a chunk beside decode rows. On the H200 the first step of each kind stalled the
server ~2 s (27B shape: the first request's TTFT 2.2 s, then the first burst of 8 again).
`warm_up(engine)` sends four small requests through the engine's own path covering those
kinds, then two 2-token prompts together (their first tokens one eager step of one-token rows),
and steps them to the end before the engine serves. Two of the four sample as served requests
do (the model preset's penalties, greedy; the preset's sampling, seeded), so the sampling
kernels a first request needs (penalties, top-k) compile here too: on the H200 the first served
request took 2.5 s to its first token, the next 72 ms. Last, the model compiles what those
requests' lengths may not reach (`warm_up_kernels`: the grouped expert kernels' row tiles, the
mixers' projections at few rows; `warm_up_paged_attention`: the attention's launches with
unsplit pages, the decode kernel as an eager step launches it), and the sampler what
their settings may not (`warm_up_sampling`: penalties and every top-k candidate count). Under
`--spec` the short requests run twice more, every step drafted and then none (the policy's two
extremes), for longer than the MTP head's spill: the first `--spec mtp` burst on the H100
compiled the plain rows' kernels (pending penalties, the head's eager pairs and drafts) in
traffic, 0.8-1.35 s.
"""
from __future__ import annotations

import dataclasses
import logging
import time

import torch

from ..models.attention import warm_up_paged_attention
from ..types import GenerationRequest, SamplingParams
from .decode_graphs import PROMPT_ROWS
from .mtp_drafter import SPILL
from .sampling import Sampler, pick_rows
from .sampling_paths import TOPK_CAP
from .spec_policy import AlwaysSpeculate, NeverSpeculate

log = logging.getLogger("ninfer.engine")

# odd lengths: kernels specialise integer arguments on divisibility by 16; both longer than the
# prompt graph's rows (`decode_graphs.PROMPT_ROWS`), so they make an eager step of several
# prompts, as a burst does (a GDN walk of several rows takes other launch sizes than one row's)
SHORT = (77, 93)
# a prompt that arrives while the others decode: past the prompt graph's rows too, so its chunk
# is an eager step of few rows (the gated GDN norm's small-launch variant, which a lone prompt
# of 65-127 tokens compiled in traffic: the steps above are thousands of rows)
BESIDE_DECODE = max(PROMPT_ROWS) + 3
# two prompts of two tokens together: a hybrid prompt's first chunk ends a token before its
# end, so each first token is a one-token row of an eager step (the GDN projections' several-row
# GEMV, the batched decode attention at position 0), whatever the step's other rows
FIRST_TOKENS = (2, 2)
LATE = ((BESIDE_DECODE,), FIRST_TOKENS)  # the late groups, each once the one before it ended
GREEDY_TOKENS = 3  # the greedy requests' output
SERVED_TOKENS = 8  # the served-sampling requests' output: long enough for lookahead steps
# under `--spec`, their output in the rounds of forced policies: past the MTP head's spill
SPECULATED_TOKENS = SPILL + 8
PAGE_ROUNDING = 64  # a request's lease is whole pages
SLACK_STEPS = 16  # steps past the requests' own, one after another, before the rest is cancelled


def warm_up(engine, prefill_chunk: int, room: int) -> float | None:
    """Run the warm-up requests on `engine` (not yet serving); `room`: tokens the free pages
    and the context allow all of them together. Returns the seconds it took, or None where the
    room is too small to run them (a toy pool: its first steps compile instead)."""
    # longer than a chunk, so its second chunk runs over its first (within the room); the
    # requests' output tokens and a page of rounding each
    outputs = 2 * GREEDY_TOKENS + len(SHORT) * SERVED_TOKENS  # long, late; the short ones
    long = min(prefill_chunk + 37, room - sum(SHORT) - BESIDE_DECODE - outputs
               - (2 + len(SHORT)) * PAGE_ROUNDING)
    if long < 1:
        log.info("warm-up skipped: %d tokens of room", room)
        return None
    started = time.monotonic()
    requests = _Requests(engine)
    requests.serve(long, SERVED_TOKENS, prefill_chunk)
    spec = engine.speculator
    if spec is not None and room >= sum(SHORT) + BESIDE_DECODE + (1 + len(SHORT)) * (
            PAGE_ROUNDING + SPECULATED_TOKENS):  # (the late groups are live one by one)
        # the short requests again, every step drafted, then none: the rows the policy
        # keeps plain in traffic take lookahead steps with pending penalties, and past
        # `SPILL` positions an MTP head's eager run of their committed pairs
        policy = spec.policy
        for forced in (AlwaysSpeculate(), NeverSpeculate()):
            spec.policy = forced
            requests.serve(0, SPECULATED_TOKENS, prefill_chunk)
        spec.policy = policy
    if engine.model.device.type == "cuda":
        warm_up_sampling(engine.model)
    kernels = getattr(engine.model, "warm_up_kernels", None)
    if kernels is not None:  # what the requests' rows may not reach (row tiles, few-row GEMVs)
        kernels()
    # nor their short steps: the paged prefill's unsplit launches, the eager decode launch
    warm_up_paged_attention(engine.memory.storage, engine.model.query_heads)
    seconds = time.monotonic() - started
    log.info("warm-up: prompt steps of every kind run once in %.1f s", seconds)
    return seconds


def warm_up_sampling(model) -> None:
    """Compile the sampling kernels' variants any request may take, whatever the preset the
    warm-up's requests sample with: the penalties with and without a pick in flight, and the
    top-k kernel for each candidate count (a power of two up to `TOPK_CAP`), over logits in the
    model's dtype and in fp32 (a step's rows beside a prompt's come out fp32). A request with
    penalties or a top_k that the preset lacks compiled them in traffic (0.24 s each)."""
    vocab = model.vocab_size
    counts = [1 << i for i in range(TOPK_CAP.bit_length()) if 1 << i <= vocab]
    penalized = Sampler(SamplingParams(temperature=0.0, presence_penalty=1.0))
    penalized.record(0)  # (a row without counted tokens is not penalized)
    others = [Sampler(SamplingParams(temperature=1.0, top_p=0.9, seed=0)),  # sorted, plain
              Sampler(SamplingParams(temperature=1.0, seed=0))]
    for dtype in dict.fromkeys((model.dtype, torch.float32)):
        logits = torch.randn(4, vocab, dtype=dtype, device=model.device)
        pending = None
        for k in counts:
            top_k = Sampler(SamplingParams(temperature=1.0, top_k=k, seed=0))
            picked = pick_rows(logits, [penalized, top_k, *others], pending)
            pending = None if pending is not None else picked.tokens  # both penalty variants
        picked.values()  # (the launches compiled as they were queued; one wait a dtype)


class _Requests:
    """The warm-up's requests, added to `engine` and stepped to the end."""

    def __init__(self, engine) -> None:
        self.engine, self.added = engine, 0
        self.gen = torch.Generator().manual_seed(0)
        self.top = min(engine.model.vocab_size, 1000)
        preset = engine.sampling_defaults
        self.penalized = dataclasses.replace(preset, temperature=0.0)  # a served `temperature: 0`
        self.sampled = dataclasses.replace(preset, temperature=preset.temperature or 1.0, seed=0)

    def serve(self, long: int, served_tokens: int, prefill_chunk: int) -> None:
        """The long prompt (none where `long` is 0) and the short ones, then the `LATE` groups
        of prompts beside their decode rows, each group once the first ones are prefilled and
        the group before it has ended (a group's rows beside the short ones' within the
        concurrency); the short ones' output `served_tokens` each. Every one of them ends
        here: the bound is their steps one request at a time (`--max-concurrency 1`) plus
        `SLACK_STEPS`, past which what is left is cancelled, so serving never starts behind
        a warm-up request (at concurrency 1 the short ones' `SPECULATED_TOKENS` outlasted the
        fixed 80 steps this loop had, and a B = 1 benchmark's first timed steps ran the
        leftovers: on the H100, 35B-A3B verify steps of 7.59 ms against a 3.64 ms graph)."""
        first = [self._add(long)] if long else []
        first += [self._add(n, sampling, served_tokens)
                  for n, sampling in zip(SHORT, (self.penalized, self.sampled))]
        mine, waiting, group = list(first), list(LATE), []
        lengths = [(long, GREEDY_TOKENS)] * bool(long) + [(n, served_tokens) for n in SHORT] + [
            (n, GREEDY_TOKENS) for g in LATE for n in g]
        limit = SLACK_STEPS + sum(-(-n // prefill_chunk) + 1 + out for n, out in lengths)
        for _ in range(limit):
            if (waiting and all(s.prefill_done for s in first)
                    and all(s.finish_reason for s in group)):
                group = [self._add(n) for n in waiting.pop(0)]
                mine += group
            busy = self.engine.step()
            if not waiting and (not busy or all(s.finish_reason for s in mine)):
                break
        left = [s for s in mine if s.finish_reason is None]
        if left:
            log.warning("warm-up: %d request(s) unfinished after %d steps, cancelled",
                        len(left), limit)
            for seq in left:
                self.engine.cancel_sequence(seq)
            for _ in range(SLACK_STEPS):
                if not self.engine.step():
                    break

    def _add(self, length: int, sampling: SamplingParams = SamplingParams(temperature=0.0),
             max_tokens: int = GREEDY_TOKENS):
        prompt = tuple(torch.randint(0, self.top, (length,), generator=self.gen).tolist())
        request = GenerationRequest(f"warm-up-{self.added}", prompt, sampling,
                                    max_tokens=max_tokens, ignore_eos=True)
        self.added += 1
        return self.engine.add(request, lambda event: None)
