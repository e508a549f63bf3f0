"""The startup warm-up (`step.warm_up`) runs every kind of prompt step once, through the engine's
own path, and leaves nothing running."""

from ninfer_engine.benchmark import engine_step
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from ninfer_engine.step.warm_up import warm_up
from ninfer_engine.types import SamplingParams
from tests.benchmark.tiny import tiny_config, tiny_source
from tests.engine.helpers import default_resources


def test_warm_up_runs_each_prompt_step_kind(monkeypatch):
    monkeypatch.setattr(engine_step.qwen_resources, "resources", lambda v: default_resources())
    config = tiny_config(False)
    source = tiny_source(config)
    model = Qwen35Model(config, FusedParams(config, lambda n, s: source(n, s).float()))
    engine = engine_step.bench_engine(model, "tiny-dense", config, 4, 512, prefill_chunk=64)
    kinds = []
    forward = engine.runner.forward

    def seen(batch):
        kinds.append(dict(prompts=len(batch.chunks), decode=len(batch.decode),
                          over_earlier=any(c.seq.cached > 0 for c in batch.chunks)))
        return forward(batch)

    engine.runner.forward = seen
    # the Qwen3.5 presets' kind: sampled with top-k, presence penalty
    engine.sampling_defaults = SamplingParams(temperature=0.7, top_k=20, top_p=0.8,
                                              presence_penalty=1.5)
    added = []
    add = engine.add
    engine.add = lambda request, emit: added.append(request.sampling) or add(request, emit)
    warm_up(engine, 64, 512)
    assert any(k["prompts"] >= 2 for k in kinds)  # several prompts in one step
    assert any(k["over_earlier"] for k in kinds)  # a chunk over the prompt's first chunk
    assert any(k["prompts"] and k["decode"] for k in kinds)  # a chunk beside decode rows
    # as served requests sample: the preset's penalties made greedy, the preset's sampling
    preset = engine.sampling_defaults
    assert any(p.temperature == 0 and (p.presence_penalty, p.frequency_penalty) == (
        preset.presence_penalty, preset.frequency_penalty) for p in added)
    assert any(p.temperature > 0 and p.top_k == preset.top_k and p.seed is not None
               for p in added)
    assert not engine.scheduler.running and not list(engine.scheduler.queued())
