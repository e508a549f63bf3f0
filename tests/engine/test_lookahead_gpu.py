"""The lookahead decode step on CUDA, where it overlaps: a tiny hybrid model (bf16, captured
decode graphs) gives the same tokens with lookahead on and off, token for token, for greedy and
seeded rows ending at different steps. Both runs replay the same graphs on the same inputs (a
lookahead step copies the picks on the device instead of loading them from the host), so the
tokens are equal exactly, not within a tolerance."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.benchmark import engine_step
from ninfer_engine.benchmark.engine_step import bench_engine
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from ninfer_engine.types import GenerationRequest, SamplingParams
from tests.benchmark.tiny import tiny_config, tiny_source
from tests.engine.helpers import default_resources

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _generate(lookahead: bool, moe: bool) -> tuple[dict[str, list[int]], int]:
    config = tiny_config(moe)
    arch = "tiny-moe" if moe else "tiny-dense"
    source = tiny_source(config)
    with torch.inference_mode():
        model = Qwen35Model(config, FusedParams(config, lambda n, s: source(n, s).to("cuda")))
        engine = bench_engine(model, arch, config, 4, 512, lookahead=lookahead)
        assert engine.runner.graphs is not None and engine.runner.graphs.capture
        launched, count = engine.runner.forward_from, [0]

        def counting(batch, tokens):
            count[0] += 1
            return launched(batch, tokens)
        engine.runner.forward_from = counting
        gen = torch.Generator().manual_seed(3)
        out: dict[str, list[int]] = {}
        for i, (max_tokens, sampling) in enumerate([
                (40, SamplingParams(temperature=0.0)), (23, SamplingParams(temperature=0.0)),
                (57, SamplingParams(temperature=0.8, top_k=20, seed=5)),
                (31, SamplingParams(temperature=1.0, seed=9))]):
            length = 30 + 17 * i
            prompt = tuple(torch.randint(0, config["vocab_size"], (length,), generator=gen).tolist())
            out[f"r{i}"] = []
            engine.add(GenerationRequest(f"r{i}", prompt, sampling, max_tokens=max_tokens,
                                         ignore_eos=True),
                       lambda e, rid=f"r{i}": out[rid].extend(e.token_ids))
        for _ in range(400):  # bounded: ~60 steps of work
            if not engine.step():
                break
        engine.stop()
    return out, count[0]


@pytest.mark.parametrize("moe", [False, True])
def test_lookahead_gives_the_ordinary_steps_tokens_on_cuda(moe, monkeypatch):
    monkeypatch.setattr(engine_step.qwen_resources, "resources", lambda v: default_resources())
    plain, none = _generate(False, moe)
    ahead, steps = _generate(True, moe)
    assert none == 0 and steps > 20
    assert [len(t) for t in plain.values()] == [40, 23, 57, 31]
    assert ahead == plain
