"""The engine's per-token log-probabilities in the two OpenAI wire forms.

The sampler appends one `TokenLogprob` per output token to the request's sink before that
token's event is emitted (types.py), so `LogprobReader.take(n)` has the entries of the first n
output tokens once their events arrived. Values are log_softmax of the model's logits, before
penalties, grammar masks and temperature (vLLM's raw logprobs). A token the engine forced
(thinking close) has no sampled distribution: Chat reports it with logprob 0.0 and no
alternatives, completions with null. Prompt tokens' entries (`prompt_logprobs`) come in the
legacy form ahead of the output's (`echo`) or in vLLM's `prompt_logprobs` form.
"""
from __future__ import annotations

from typing import Any

from ninfer_engine.client import TextTokenizer
from ninfer_engine.types import TokenLogprob


class LogprobReader:
    """Reads one generation's sink in order and renders entries as Chat or completions JSON."""

    def __init__(self, sink: list[TokenLogprob] | None, tokenizer: TextTokenizer) -> None:
        self.sink = sink
        self.tokenizer = tokenizer
        self.taken = 0

    def take(self, upto: int) -> list[TokenLogprob]:
        """The entries after the last taken one, up to output token `upto` (exclusive)."""
        if self.sink is None:
            return []
        entries = self.sink[self.taken:upto]
        self.taken += len(entries)
        # the end-of-sequence token ends the answer; it is no part of its text
        return [e for e in entries if e.token not in self.tokenizer.eos_token_ids]

    def take_answer(self, start: int, upto: int) -> list[TokenLogprob]:
        """`take(upto)` without the entries before output token `start` (the reasoning's)."""
        self.taken = max(self.taken, start)
        return self.take(upto)

    def text(self, token: int) -> str:
        return self.tokenizer.decode([token])

    def chat(self, entries: list[TokenLogprob]) -> dict[str, Any] | None:
        """Chat's `logprobs` object of a choice or chunk (None when not asked for)."""
        if self.sink is None:
            return None
        return {"content": self.entries(entries), "refusal": None}

    def entries(self, entries: list[TokenLogprob]) -> list[dict[str, Any]]:
        """Chat's entry objects (`token`, `logprob`, `bytes`, `top_logprobs`), which Responses'
        `output_text.logprobs` share."""
        return [self._chat_entry(e) for e in entries]

    def _chat_entry(self, entry: TokenLogprob) -> dict[str, Any]:
        top = [self._chat_token(token, value) for token, value in entry.top]
        return {**self._chat_token(entry.token, entry.logprob or 0.0), "top_logprobs": top}

    def _chat_token(self, token: int, value: float) -> dict[str, Any]:
        text = self.text(token)
        return {"token": text, "logprob": value, "bytes": list(text.encode())}

    def completion(self, entries: list[TokenLogprob], offset: int) -> dict[str, Any] | None:
        """The legacy completions `logprobs` object; `offset` is where the first token's text
        starts in the choice's text."""
        if self.sink is None:
            return None
        tokens, offsets = [], []
        for entry in entries:
            offsets.append(offset)
            tokens.append(self.text(entry.token))
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self.text(t): v for t, v in e.top} for e in entries],
                "text_offset": offsets}

    def prompt_completion(self, entries: list[TokenLogprob], top: int) -> dict[str, Any]:
        """The legacy `logprobs` object of the prompt's tokens (`echo`): the first has no value
        and no alternatives (null), as OpenAI returned it."""
        tokens, offsets, offset = [], [], 0
        for entry in entries:
            offsets.append(offset)
            tokens.append(self.text(entry.token))
            offset += len(tokens[-1])
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [None if e.logprob is None else
                                 {self.text(t): v for t, v in e.top[:top]} for e in entries],
                "text_offset": offsets}

    def vllm_prompt(self, entries: list[TokenLogprob], top: int) -> list[Any]:
        """vLLM's `prompt_logprobs`: per prompt token null (the first) or {token id: {logprob,
        rank, decoded_token}} of the token itself and the `top` most likely ones."""
        out: list[Any] = []
        for entry in entries:
            if entry.logprob is None:
                out.append(None)
                continue
            ranked = {str(t): {"logprob": v, "rank": r, "decoded_token": self.text(t)}
                      for r, (t, v) in enumerate(entry.top[:top], start=1)}
            ranked[str(entry.token)] = {"logprob": entry.logprob, "rank": entry.rank,
                                        "decoded_token": self.text(entry.token)}
            out.append(ranked)
        return out


def joined(first: dict[str, Any] | None, then: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two legacy `logprobs` objects as one (the prompt's, then the output's)."""
    if first is None or then is None:
        return first or then
    return {key: first[key] + then[key] for key in first}
