"""Shared by the grammar-mask prefetch tests (CPU and CUDA) and the grammar-drafting tests: a
tiny model with the default model's tokenizer, a step-by-step engine driver, a JSON schema the
tiny models must follow, and a recorder of the masks the sampler applies."""
from __future__ import annotations

import torch

from ninfer_engine.cli.flags import default_artifact
from ninfer_engine.constrained import mask
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest

from .helpers import FakeArtifact, tiny_llama

MODEL = default_artifact()
ROLES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json",
         "chat_template.jinja")

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["n", "c", "xs"],
          "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "c": {"enum": ["red", "green"]},
                         "xs": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}}}


def tokenizer_artifact() -> FakeArtifact:
    """A tiny random llama (seed 3) with the default model's real tokenizer and template."""
    from ninfer_engine.artifact import open_artifact

    with open_artifact(MODEL) as real:
        resources = {role: real.resource(role) for role in ROLES if real.has_resource(role)}
        vocab = real.config("text")["vocab_size"]
    return FakeArtifact(tiny_llama(seed=3, vocab_size=vocab), resources=resources)


def drive(engine: Engine, requests: list[GenerationRequest]) -> dict[str, list]:
    """Each request's events, all added before the first step, the engine stepped here."""
    events: dict[str, list] = {r.request_id: [] for r in requests}
    for request in requests:
        assert engine.add(request, events[request.request_id].append) is not None
    with torch.inference_mode():
        for _ in range(500):
            if not engine.step():
                break
    assert all(e and e[-1].finish for e in events.values()), "a request did not end"
    return events


def tokens(events: list) -> list[int]:
    return [t for e in events for t in e.token_ids]


def prompt(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"))


def record_masks(monkeypatch) -> list:
    """(constraint, its version, the bits row on the host) of every mask the sampler applies."""
    applied = []
    original = mask.apply_constraints

    def recording(logits, rows, constraints, bits=None):
        for i, c in enumerate(constraints):
            applied.append((c, c.version, bits[i].clone(), bits.is_pinned()))
        return original(logits, rows, constraints, bits)

    monkeypatch.setattr(mask, "apply_constraints", recording)
    return applied


def check_masks(applied: list, constraint, grammar: str, out: list[int], compile_) -> None:
    """The masks applied to `constraint`'s row: one a token of `out`, in order, each equal to
    the synchronous mask of a fresh constraint replaying `out` (`compile_(grammar)`)."""
    mine = [(v, bits) for c, v, bits, _ in applied if c is constraint]
    assert [v for v, _ in mine] == list(range(len(out)))
    replay = compile_(grammar)
    for (version, bits), token in zip(mine, out):
        assert torch.equal(bits, mask.bitmasks([replay])[0]), version
        replay.advance(token)
    assert replay.matcher.is_accepting()

