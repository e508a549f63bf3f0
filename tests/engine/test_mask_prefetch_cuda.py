"""Grammar masks prefetched during a CUDA-graph decode step (issue 21; run on the device:
`NINFER_TEST_DEVICE=cuda pytest -m gpu tests/engine/test_mask_prefetch_cuda.py`): the tiny
Qwen3.5 dense model with the real Qwen3.5 tokenizer (248K tokens), four constrained rows and a
plain one through the captured step. Every applied mask equals the synchronous one, came from
page-locked memory, and the outputs are what they are with prefetching off."""
from __future__ import annotations

import json

import pytest
import torch

from ninfer_engine.artifact.synth import write_synthetic
from ninfer_engine.config import EngineConfig
from ninfer_engine.constrained import compile_constraint, json_schema_grammar, prefetch
from ninfer_engine import engine_load
from ninfer_engine.engine import Engine
from ninfer_engine.types import GenerationRequest, SamplingParams

from .mask_helpers import SCHEMA, check_masks, drive, prompt, record_masks, tokens

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write_synthetic("tiny-dense", tmp_path_factory.mktemp("mask") / "tiny.ninfer")


def run(path, enabled: bool, monkeypatch):
    # on CUDA whatever NINFER_TEST_DEVICE says (tests/engine/conftest.py pins the CPU by default)
    monkeypatch.setattr(engine_load, "serving_device", lambda config: torch.device("cuda"))
    monkeypatch.setattr(prefetch, "ENABLED", enabled)
    prefetch.COUNTERS.reset()
    engine = Engine(EngineConfig(artifact=path, max_context=1024, max_concurrency=8))
    assert engine.runner.graphs is not None  # the captured decode step serves these rows
    grammar = json_schema_grammar(SCHEMA)
    constraints, batch = {}, []
    for i in range(5):
        sampling = (SamplingParams(temperature=0.0) if i % 2 == 0
                    else SamplingParams(temperature=1.0, top_k=20, seed=i))
        constraint = compile_constraint(engine.tokenizer, grammar) if i < 4 else None
        if constraint is not None:
            constraints[f"r{i}"] = constraint
        batch.append(GenerationRequest(f"r{i}", prompt(engine, f"item {i} as JSON"), sampling,
                                       max_tokens=60, constraint=constraint))
    try:
        events = drive(engine, batch)
    finally:
        engine.stop()
    return engine, grammar, constraints, events


def test_constrained_rows_through_the_graph_step(path, monkeypatch):
    applied = record_masks(monkeypatch)
    engine, grammar, constraints, events = run(path, True, monkeypatch)
    counters = prefetch.COUNTERS
    for rid, constraint in constraints.items():
        out = tokens(events[rid])
        assert events[rid][-1].finish == "stop", rid
        value = json.loads(engine.tokenizer.decode(out[:-1]))
        assert set(value) == {"n", "c", "xs"} and value["c"] in ("red", "green")
        check_masks(applied, constraint, grammar, out,
                    lambda g: compile_constraint(engine.tokenizer, g))
    assert all(pinned for *_, pinned in applied)  # the copy to the device does not block
    total = sum(len(tokens(events[rid])) for rid in constraints)
    assert (counters.prefetched_rows, counters.sync_rows) == (total, 0)  # firsts: at prompt
    want = {rid: tokens(e) for rid, e in events.items()}
    *_, plain = run(path, False, monkeypatch)
    assert {rid: tokens(e) for rid, e in plain.items()} == want
