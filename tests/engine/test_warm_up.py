"""The startup warm-up (`step.warm_up`) runs every kind of prompt step once, through the engine's
own path, and leaves nothing running."""

from ninfer_engine.benchmark import engine_step
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from ninfer_engine.step.warm_up import warm_up
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
    warm_up(engine, 64, 512)
    assert any(k["prompts"] >= 2 for k in kinds)  # several prompts in one step
    assert any(k["over_earlier"] for k in kinds)  # a chunk over the prompt's first chunk
    assert any(k["prompts"] and k["decode"] for k in kinds)  # a chunk beside decode rows
    assert not engine.scheduler.running and not list(engine.scheduler.queued())
