"""A verify step on CUDA waits for the device once: acceptance reads the step's picks back
(`acceptance.accept_greedy`), and nothing else of the round — scheduling, drafting, the graph's
inputs, the rollback of the rejected drafts, bookkeeping — makes the host wait for the GPU. A
sync after the replay leaves the GPU idle while the host works; one before it serialises the
host's launches with the work queued (the 35B-A3B verify step's engine time exceeded its graph's
by 0.9-1.4 ms on the H200, h200-verify-step.md). The oracle drafter forces 2 or 3 of 3 drafts a
round, so the rollback runs in most rounds."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine import engine as engine_module
from ninfer_engine.benchmark import engine_step
from ninfer_engine.benchmark.engine_step import bench_engine
from ninfer_engine.benchmark.forced_drafts import ForcedRounds, OracleDrafter
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from ninfer_engine.step.spec_policy import AlwaysSpeculate
from ninfer_engine.types import GenerationRequest, SamplingParams
from tests.benchmark.tiny import tiny_config, tiny_source
from tests.engine.helpers import cuda_syncs, default_resources

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _engine(moe: bool, mtp: bool):
    """The tiny model served with 3-draft verify rounds (`mtp`: from its random MTP head)."""
    config = tiny_config(moe)
    source = tiny_source(config, mtp=mtp)
    model = Qwen35Model(config, FusedParams(config, lambda n, s: source(n, s).to("cuda")))
    return bench_engine(model, "tiny-moe" if moe else "tiny-dense", config, 1, 512,
                        draft_tokens=3,
                        mtp_params=(lambda n, s: source(n, s).to("cuda")) if mtp else None)


def _syncs_a_round(engine, drafter, sampling=SamplingParams(temperature=0.0)
                   ) -> list[list[str]]:
    """Each of 8 warm verify rounds' syncs, `drafter` forcing 2 or 3 of 3 drafts a round."""
    engine.speculator.drafter, engine.speculator.policy = drafter, AlwaysSpeculate()
    prompt = tuple(range(5, 45))
    engine.add(GenerationRequest("r", prompt, sampling, max_tokens=200, ignore_eos=True),
               lambda e: None)
    with drafter.forced():
        for _ in range(12):  # the prompt, then verify rounds: the graphs captured, warm
            engine.step()
        torch.cuda.synchronize()
        rounds = engine.speculator.stats().rounds
        per_step = []
        for _ in range(8):
            with cuda_syncs() as syncs:
                engine.step()
            per_step.append(syncs)
    engine.stop()
    assert engine.speculator.stats().rounds == rounds + 8  # every step counted verified
    return per_step


@pytest.mark.parametrize("moe", [False, True])
@torch.inference_mode()
def test_a_verify_round_syncs_once(moe, monkeypatch):
    monkeypatch.setattr(engine_step.qwen_resources, "resources", lambda v: default_resources())
    monkeypatch.setattr(engine_module, "BUSY_PUBLISH_S", 1e9)  # no stats snapshot meanwhile
    engine = _engine(moe, mtp=False)
    per_step = _syncs_a_round(engine, OracleDrafter(3.5, 3, engine.model.vocab_size, seed=1))
    assert all(len(syncs) == 1 for syncs in per_step), per_step


@pytest.mark.parametrize("moe,penalties", [(False, False), (True, False), (False, True)])
@torch.inference_mode()
def test_a_chained_mtp_round_waits_once(moe, penalties, monkeypatch):
    """`--spec mtp` through the verify chain (`step.verify_chain`, rounds launched ahead by
    `chain_ahead`): a step's one wait is for a round's results (j, bonus, next drafts), on
    their copy's event, which torch's sync check does not see, so it must see none: drafting,
    the verify inputs, the rollback, the penalties' counts (`chain_penalties`) and the
    bookkeeping make the host wait for nothing."""
    from ninfer_engine.step import chain_rounds

    monkeypatch.setattr(engine_step.qwen_resources, "resources", lambda v: default_resources())
    monkeypatch.setattr(engine_module, "BUSY_PUBLISH_S", 1e9)
    waits = []
    results = chain_rounds._Round.results
    monkeypatch.setattr(chain_rounds._Round, "results", lambda r: waits.append(
        r.read is None) or results(r))
    engine = _engine(moe, mtp=True)
    assert engine.runner.chain is not None
    step = engine.step
    counted = []
    engine.step = lambda: (waits.clear(), step(), counted.append(sum(waits)))[1]
    sampling = SamplingParams(temperature=0.0, presence_penalty=1.5 if penalties else 0.0)
    per_step = _syncs_a_round(engine, ForcedRounds(engine.speculator.drafter, 3.5, 3, seed=1),
                              sampling)
    assert all(not syncs for syncs in per_step), per_step
    assert counted[-8:] == [1] * 8, counted
