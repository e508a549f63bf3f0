"""The kernel decode step (`HybridStep`, Triton under the interpreter on the CPU) with offloaded
experts: the MoE layers read device slots through the expert → slot map, each layer copies the
next one's guessed experts ahead (prefetch), and with every miss copied the step's logits equal
the all-resident step's bit for bit."""
from __future__ import annotations

import torch

from ninfer_engine.experts import plan_placement
from ninfer_engine.experts.tiers import ExpertTiers, expert_name
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests.engine.hybrid_helpers import HybridArtifact
from tests.hybrid_step_harness import StepHarness

EXPERT_BYTES = (48 * 64 + 64 * 24) * 2  # bf16


def test_the_graph_step_reads_slots_and_copied_misses_are_exact(device):
    artifact = HybridArtifact("qwen3_5_moe")  # 128 tokens of vocabulary: a fast head
    config = artifact.config("text")

    def source(name, shape):
        return artifact.parameter(name, shape).to(device, torch.bfloat16)

    resident = Qwen35Model(config, FusedParams(config, source))
    tiers = ExpertTiers(config, plan_placement(config, EXPERT_BYTES, 2 * 4 * EXPERT_BYTES),
                        lambda l, e, m, s: source(expert_name(l, e, m), s), device, "copy",
                        prefetch=True)
    tiered = Qwen35Model(config, FusedParams(config, tiers.placeholders(source), tiers))
    tiers.install(tiered)
    prompt = torch.tensor([3, 17, 99, 5, 64, 120, 7, 41], device=device)
    logits = []
    for model in (resident, tiered):
        torch.manual_seed(0)  # the harness's shuffled page table
        state = model.new_state()
        model.forward(prompt, state)
        step = StepHarness(model, model.params, 64)
        step.load_state(state)
        tok, out = torch.tensor([11], device=device), []
        for _ in range(2):  # the second step reads the state the first wrote
            out.append(step.step(tok))
            tok = out[-1].argmax(-1)
        logits.append(out)
    for a, b in zip(*logits):
        assert torch.equal(a, b)
    layers = tiers.layers.values()
    assert sum(t.map.misses for t in layers) > 0 and sum(t.cpu_pairs for t in layers) == 0
    assert sum(t.prefetched for t in layers) > 0  # the next layers' guesses were copied ahead
