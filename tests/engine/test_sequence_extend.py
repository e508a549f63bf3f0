"""`Sequence.extend` (a verify row's tokens) against `append` token by token: the same output,
sampler counts, text, finish reason and stop string, in one event where the row does not end
(an EOS, a stop string across its tokens, the output limit inside it)."""
from __future__ import annotations

import pytest

from ninfer_engine.step.sampling import Sampler
from ninfer_engine.step.sequence import Sequence
from ninfer_engine.types import GenerationRequest, SamplingParams

EOS = 9
TEXT = {1: "a", 2: "b", 3: "c", 4: "d", EOS: ""}


class _Letters:
    """A detokenizer whose tokens are letters."""

    def add(self, tokens):
        return "".join(TEXT[t] for t in tokens)

    def finish(self):
        return ""


def _seq(stop=(), max_tokens=16):
    request = GenerationRequest("r", (5, 6), SamplingParams(temperature=0.0),
                                max_tokens=max_tokens, stop=tuple(stop))
    events = []
    seq = Sequence(request, events.append, Sampler(request.sampling), _Letters(),
                   frozenset({EOS}))
    return seq, events


@pytest.mark.parametrize("tokens, stop, max_tokens", [
    ([1, 2, 3], (), 16),  # goes on: one event
    ([1, 2, 3, 4], ("bc",), 16),  # a stop string across the row's tokens
    ([1, EOS, 3], (), 16),  # EOS inside the row: what follows it is not taken
    ([1, 2, 3, 4], (), 3),  # the output limit inside the row
])
def test_extend_is_append_token_by_token_in_one_event(tokens, stop, max_tokens):
    one, one_events = _seq(stop, max_tokens)
    one.output.append(4)  # a token before the round
    one.extend(tokens, 1.0)
    each, each_events = _seq(stop, max_tokens)
    each.output.append(4)
    for token in tokens:
        each.sampler.record(token)
        each.append(token, 1.0)
        if each.finish_reason is not None:
            break
    assert one.output == each.output and one.sampler.counts == each.sampler.counts
    assert one.finish_reason == each.finish_reason
    assert "".join(e.text for e in one_events) == "".join(e.text for e in each_events)
    assert [e.stop_sequence for e in one_events if e.finish] == [
        e.stop_sequence for e in each_events if e.finish]
    assert sum(len(e.token_ids) for e in one_events) == sum(len(e.token_ids) for e in each_events)
    assert len(one_events) == 1
