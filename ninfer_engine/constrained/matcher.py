"""One request's grammar state, advanced by every output token the sampler records.

`compile_constraint(tokenizer, grammar)` builds it for the engine's tokenizer (the llguidance
view of a tokenizer costs about half a second to build, so it is made once per tokenizer).
A constraint may wait for a token sequence before it applies (`start_after`: the end of a
thinking block), so a reasoning model thinks freely and only its answer is constrained.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Any, Sequence

import llguidance

from .grammar import CALL_TAG, GrammarError, with_tag_tokens

# an engine tokenizer's llguidance view, and whether it holds the call tags as special tokens
_TOKENIZERS: weakref.WeakKeyDictionary[Any, tuple[llguidance.LLTokenizer, bool]] = (
    weakref.WeakKeyDictionary())
_LOCK = threading.Lock()
_ENGINE_TOKENIZER: list[Any] = []  # an engine process's tokenizer (`use_engine_tokenizer`)


class ConstraintUnavailable(RuntimeError):
    """The engine's tokenizer is not one llguidance can read (a scripted test engine)."""


def llg_tokenizer(tokenizer: Any) -> llguidance.LLTokenizer:
    """The llguidance tokenizer of an engine `Tokenizer` (its Hugging Face `tokenizer.json`)."""
    return _view(tokenizer)[0]


def _view(tokenizer: Any) -> tuple[llguidance.LLTokenizer, bool]:
    """(`llg_tokenizer`, whether it holds the call tags as special tokens), built once."""
    backend = getattr(tokenizer, "backend", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise ConstraintUnavailable("this engine's tokenizer cannot drive constrained decoding")
    with _LOCK:
        cached = _TOKENIZERS.get(tokenizer)
        if cached is None:
            view = llguidance.LLTokenizer(backend.to_str(), n_vocab=tokenizer.vocab_size,
                                          eos_token=list(tokenizer.eos_token_ids))
            cached = _TOKENIZERS[tokenizer] = (view, _holds_tag_tokens(view))
        return cached


def _holds_tag_tokens(view: llguidance.LLTokenizer) -> bool:
    """Whether the tokenizer holds the tool-call tags as special tokens (one each)."""
    def special(text: str) -> bool:
        ids = view.tokenize_bytes(text.encode())
        return len(ids) == 1 and view.is_special_token(ids[0])
    return special(CALL_TAG) and special(CALL_TAG.replace("<", "</"))


class TokenConstraint:
    """The tokens a grammar allows next, for one generation.

    `version` counts the recorded tokens: a mask computed at one version is the mask of that
    state only (`prefetch` keeps it beside the version it was filled at). While a background
    fill reads the matcher (`prefetch.start`), every use of `matcher` here or by a caller
    first waits for that fill: llguidance's matcher is not to be used by two threads at once.
    """

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int,
                 start_after: Sequence[int] = (), grammar: str = "") -> None:
        self._matcher = matcher
        self.grammar = grammar  # what it was compiled from (an engine process compiles it again)
        self.vocab = vocab  # tokens the grammar's tokenizer knows (bits of one mask row)
        self._start_after = tuple(start_after)
        self._recent: deque[int] = deque(maxlen=max(len(self._start_after), 1))
        self.active = not self._start_after
        self.version = 0
        self.inflight: Any = None  # the background fill reading the matcher (a Future)
        self.prefetched: Any = None  # (fill, row, version) of a prefetched mask (`prefetch`)
        # (version, drafts, bits) of a verify row's masks (`step.grammar_drafts`)
        self.verify: Any = None

    @property
    def matcher(self) -> llguidance.LLMatcher:
        """The llguidance matcher, once no background fill reads it."""
        self.settle()
        return self._matcher

    def __reduce__(self):
        """Sent to an engine process (`engine_process`) before its first token: compiled again
        there, over that process's tokenizer (a matcher does not pickle)."""
        if self.version:
            raise TypeError("a constraint that has advanced cannot be sent to another process")
        return _compile_for_engine, (self.grammar, self._start_after)

    def settle(self) -> None:
        """Wait for a background fill that reads this matcher (its own errors are the
        prefetcher's: a failed fill only means no prefetched mask)."""
        inflight = self.inflight
        if inflight is not None:
            self.inflight = None
            inflight.exception()  # waits; the result is read by whoever takes the mask

    def advance(self, token: int) -> None:
        """Record an output token (sampled or forced by the engine)."""
        self.version += 1  # before anything: a mask prefetched for the old state is stale now
        if self.active:
            self.matcher.consume_token(token)  # a refused token leaves the matcher in error
            return
        self._recent.append(token)
        if tuple(self._recent) == self._start_after:
            self.active = True

    def draftable(self, drafts: Sequence[int]) -> int:
        """How many of `drafts` a verify row may carry from this state: the prefix the grammar
        accepts (the matcher is left as it was); before the grammar applies, the drafts before
        the one that would start it (the positions after it need masks this state has not)."""
        if self.active:
            return self.matcher.validate_tokens(list(drafts))
        recent = deque(self._recent, maxlen=self._recent.maxlen)
        for i, token in enumerate(drafts):
            recent.append(token)
            if tuple(recent) == self._start_after:
                return i
        return len(drafts)

    def check(self) -> None:
        """Raise when the output already left the grammar (no mask can repair that)."""
        if self.matcher.is_error():
            raise RuntimeError(f"the output left its grammar: {self.matcher.get_error()}")


def compile_constraint(tokenizer: Any, grammar: str,
                       start_after: Sequence[int] = ()) -> TokenConstraint:
    """A fresh constraint for `grammar` (from grammar.py) over the engine's tokenizer; the
    call tags name its special tokens where it holds them so (`grammar.with_tag_tokens`)."""
    view, tag_tokens = _view(tokenizer)
    matcher = llguidance.LLMatcher(
        view, with_tag_tokens(grammar) if tag_tokens else grammar, log_level=0)
    if matcher.is_error():
        raise GrammarError(matcher.get_error())
    return TokenConstraint(matcher, view.vocab_size, start_after, grammar)


def use_engine_tokenizer(tokenizer: Any) -> None:
    """The tokenizer this engine process compiles received constraints over."""
    _ENGINE_TOKENIZER[:] = [tokenizer]


def _compile_for_engine(grammar: str, start_after: Sequence[int]) -> TokenConstraint:
    if not _ENGINE_TOKENIZER:
        raise RuntimeError("a constraint arrived in a process without an engine tokenizer")
    return compile_constraint(_ENGINE_TOKENIZER[0], grammar, start_after)
