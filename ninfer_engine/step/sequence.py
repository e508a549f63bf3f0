"""One request inside the engine (`Sequence`): its sampler, detokenizer, stop strings, cache
lease and timings. `Sequence.append()` turns each sampled token into text events (UTF-8 safe,
stop strings withheld) and decides when the request finishes; `next_tokens` samples a step's
rows at once.
"""
from __future__ import annotations

import dataclasses
import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..kv import PagedKvCache
from ..thinking import ThinkingCap
from ..tokenizer import IncrementalDetokenizer
from ..types import EngineError, GenerationRequest, TokenEvent, Timings, Usage
from .sampling import Sampler, sample_rows
from .spec_overlap import prompt_ngram_overlap


class StopFilter:
    """Withholds text that could still become a stop string; reports the first complete one."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> tuple[str, str | None]:
        """Returns (text safe to emit, the stop string that matched or None)."""
        if not self.stops:
            return text, None
        buf = self._held + text
        hits = [(buf.find(s), s) for s in self.stops if s in buf]
        if hits:
            index, stop = min(hits)
            self._held = ""
            return buf[:index], stop
        keep = 0
        for k in range(min(len(buf), max(map(len, self.stops)) - 1), 0, -1):
            if any(s.startswith(buf[-k:]) for s in self.stops):
                keep = k
                break
        self._held = buf[len(buf) - keep:]
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


@dataclass(eq=False)
class Sequence:
    """One request's engine-side state. Only the engine thread mutates it, except `cancelled`."""

    request: GenerationRequest
    emit: Callable[[TokenEvent], None]
    sampler: Sampler
    detokenizer: IncrementalDetokenizer
    eos_token_ids: frozenset[int]
    arrived: float = field(default_factory=time.monotonic)
    # when the front end handed it to the engine (`Engine.add`); its arrival where none is given
    handed: float | None = None
    cache: PagedKvCache | None = None
    state: Any = None  # recurrent-state slot (hybrid family)
    cached: int = 0  # tokens whose K/V is in the cache
    reused: int = 0  # prompt tokens restored from a prefix checkpoint, not computed
    reuse_path: str = "root"  # the kind of checkpoint they came from (`Timings.reuse_path`)
    output: list[int] = field(default_factory=list)
    cancelled: bool = False  # set from the event loop when the consumer goes away
    finish_reason: str | None = None
    admitted: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    drafted: int = 0  # speculative draft tokens verified for this request
    draft_accepted: int = 0  # ... and accepted
    draft_rounds: list[int] = field(default_factory=list)  # accepted drafts, a round each
    draft_fallback: int = 0  # decode steps it did not draft while speculation was on
    spec_detail: bool = False  # --log-speculation-detail: its final timings measure overlap
    media_rows: dict = field(default_factory=dict)  # media item -> encoder rows, until prefilled
    vision_s: float = 0.0  # time the vision tower spent on this request's media
    # its K/V and recurrent state are those of its first `cached` tokens (False: a verify
    # round launched ahead moved them past where it ended: no checkpoint, `verify_chain`)
    state_exact: bool = True
    _unsent: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.handed is None:
            self.handed = self.arrived
        self.stop_filter = StopFilter(self.request.stop)
        self.thinking_cap = ThinkingCap.for_request(self.request)

    @property
    def id(self) -> str:
        return self.request.request_id

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.request.prompt_ids

    @functools.cached_property
    def prefix_key(self) -> tuple[int, ...]:
        """The prompt as the prefix tree keys it: media pads carry their item's digest."""
        media = self.request.media
        return self.prompt if media is None else media.prefix_key(self.prompt)

    @property
    def rope_delta(self) -> int:
        """Rotary position minus index of the tokens after the prompt (media shift them)."""
        return 0 if self.request.media is None else self.request.media.rope_delta

    @property
    def prefill_done(self) -> bool:
        return self.cached >= len(self.prompt)

    @property
    def phase(self) -> str:
        if self.admitted is None:
            return "queued"
        return "decode" if self.prefill_done else "prefill"

    def next_token(self, logits: torch.Tensor) -> int:
        """The next forced thinking-close token if one is due, else a token sampled from this
        request's logits row [V]."""
        return next_tokens([self], logits[None])[0]

    @property
    def forced_due(self) -> bool:
        """A forced thinking-close token replaces sampling this step."""
        return self.thinking_cap is not None and bool(self.thinking_cap.forced)

    def take_forced(self) -> int:
        token = self.thinking_cap.forced.popleft()
        self.sampler.record(token)  # penalties see the forced tokens like generated ones
        return token

    def report_progress(self) -> None:
        """A progress event after a prefill chunk: prompt total, reused, processed so far."""
        total = len(self.prompt)
        self.emit(TokenEvent(progress=(total, self.reused, min(self.cached, total))))

    def append(self, token: int, now: float) -> None:
        """Record a generated token and stream its text; finishes on EOS, stop string or limit."""
        self._take([token], now, record=False)

    def extend(self, tokens: list[int], now: float) -> None:
        """`append` of a verify row's tokens, each recorded by the sampler first, with the
        text of them all in one event (an event a token was ~2.6 more events a round, each
        with its timings, for one instant's tokens); it stops at the one it finishes on."""
        self._take(tokens, now, record=True)

    def _take(self, tokens: list[int], now: float, record: bool) -> None:
        text = ""
        for token in tokens:
            if record:
                self.sampler.record(token)
            self.output.append(token)
            self._unsent.append(token)
            if self.thinking_cap is not None:
                self.thinking_cap.observe(self.output)
            self.first_token = self.first_token or now
            self.last_token = now
            if token in self.eos_token_ids:
                self.finish("stop", text)
                return
            piece, stop = self.stop_filter.push(self.detokenizer.add([token]))
            text += piece
            if stop is not None:
                self._final(text, "stop", stop)
                return
            if len(self.output) >= self.request.max_tokens:
                self.finish("length", text)
                return
        if text:
            self._send(TokenEvent(text=text, token_ids=tuple(self._unsent),
                                  timings=self.timings()))

    def finish(self, reason: str, text: str = "") -> None:
        """End normally: flush held-back text (a stop string may still complete in it)."""
        tail, stop = self.stop_filter.push(self.detokenizer.finish())
        if stop is not None:
            self._final(text + tail, "stop", stop)
        else:
            self._final(text + tail + self.stop_filter.flush(), reason)

    def fail(self, error: EngineError) -> None:
        self._final("", "error", error=error)

    def cancel(self) -> None:
        self._final("", "cancelled")

    def _final(self, text: str, reason: str, stop: str | None = None,
               error: EngineError | None = None) -> None:
        self.finish_reason = reason
        self._send(TokenEvent(
            text=text, token_ids=tuple(self._unsent), finish=reason, stop_sequence=stop,
            usage=Usage(len(self.prompt), len(self.output), self.reused),
            timings=dataclasses.replace(
                self.timings(), draft_rounds=tuple(self.draft_rounds),
                draft_fallback=self.draft_fallback,
                prompt_ngram_overlap=prompt_ngram_overlap(self.prompt, self.output)
                if self.spec_detail else None),
            error=error,
        ))

    def _send(self, event: TokenEvent) -> None:
        self._unsent = []
        self.emit(event)

    def timings(self) -> Timings:
        admitted = self.admitted or time.monotonic()
        first = self.first_token or self.last_token or admitted
        return Timings(
            queue_s=admitted - self.arrived,
            prefill_s=max(first - admitted, 0.0) if self.first_token else 0.0,
            decode_s=(self.last_token - first) if self.last_token else 0.0,
            prompt_n=max(min(self.cached, len(self.prompt)) - self.reused, 0),
            cache_n=self.reused,
            reuse_path=self.reuse_path,
            predicted_n=len(self.output),
            draft_n=self.drafted,
            draft_accepted=self.draft_accepted,
            vision_s=self.vision_s,
        )


def next_tokens(seqs: list[Sequence], logits: torch.Tensor) -> list[int]:
    """Each sequence's next token, row i of logits [len(seqs), V] being seqs[i]'s: a due forced
    thinking-close token, else sampled with all the others in one `sample_rows` (one host sync).
    Forced tokens are taken only once sampling succeeded, so a failed call can be retried."""
    rows = [i for i, seq in enumerate(seqs) if not seq.forced_due]
    sampled = iter(sample_rows(logits if len(rows) == len(seqs) else logits[rows],
                               [seqs[i].sampler for i in rows]) if rows else [])
    return [seq.take_forced() if seq.forced_due else next(sampled) for seq in seqs]


class RequestError(Exception):
    """A failure that belongs to one request only."""

    def __init__(self, message: str, code: str = "invalid_request_error", status: int = 400):
        super().__init__(message)
        self.error = EngineError(message, code, status)
