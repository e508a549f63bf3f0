"""`HostPhases` (`bench/profile_step.py --phases`): an engine's step phases timed while the
probe is on, each call counted once in its phase, and the engine as it was afterwards."""
import pytest
import torch

from ninfer_engine.benchmark import engine_step, forced_drafts
from ninfer_engine.benchmark.host_phases import HostPhases
from ninfer_engine.step import acceptance, postprocess
from ninfer_engine.step.spec_policy import AlwaysSpeculate
from ninfer_engine.types import GenerationRequest, SamplingParams

STEPS = 12


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU engine's phases")
@torch.inference_mode()
def test_every_verify_step_counts_each_phase_once_and_the_probe_leaves_nothing_behind():
    from ninfer_engine.artifact.synth import build_synthetic
    from ninfer_engine.models.qwen3_5 import Qwen35Model

    config, source = build_synthetic("tiny-moe", "cpu", torch.float32, layers=2)
    engine = engine_step.bench_engine(Qwen35Model(config, source), "tiny-moe", config, 1, 256,
                                      draft_tokens=3)
    try:
        oracle = forced_drafts.OracleDrafter(3.0, 3, config["vocab_size"], seed=3)
        engine.speculator.drafter, engine.speculator.policy = oracle, AlwaysSpeculate()
        attrs = set(vars(engine))
        with oracle.forced():
            prompt, = engine_step.random_prompts(1, 40, config["vocab_size"])
            engine.add(GenerationRequest("p", prompt, SamplingParams(temperature=0.0),
                                         max_tokens=200, ignore_eos=True), lambda e: None)
            for _ in range(3):  # the prompt, then verify rounds
                engine.step()
            accepting = postprocess.accept  # (the oracle's forced acceptance)
            with HostPhases(engine) as phases:
                for _ in range(STEPS):
                    engine.step()
            assert postprocess.accept is accepting  # the probe's wrapper is gone
        rounds = engine.speculator.stats().rounds
    finally:
        engine.stop()
    assert rounds >= STEPS
    # every step schedules, drafts, forwards, and accepts one verify row on the host
    for name in ("schedule", "draft", "forward", "finish", "accept_rows", "read_back", "keep"):
        assert phases.calls[name] == STEPS, name
    s = phases.seconds
    assert s["finish"] >= s["accept_rows"] >= s["read_back"] > 0
    assert s["accept_rows"] >= s["keep"] > 0
    line = phases.report(STEPS)
    assert line.startswith(f"host phases, ms a step over {STEPS} steps: schedule ")
    assert "accept_rows" in line and line.index("accept_rows") < line.index("read_back")
    # unwrapped: no instance attribute is left
    assert set(vars(engine)) == attrs
    assert "keep" not in vars(engine.runner) and "schedule" not in vars(engine.scheduler)
    assert postprocess.accept is acceptance.accept
