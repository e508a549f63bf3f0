"""The compiled CPU step on sampled rows of the real default model, over requests that follow each
other on one engine (issue 25's suspects for a sampled Claude Code turn that rambled on a shared
server: sampled rows, prefix-cache hits, state the C step keeps between requests): every logit
row it hands the sampler equals transformers' fp32 forward of the same tokens, teacher-forced."""
from __future__ import annotations

import asyncio

import pytest
import torch

from ninfer_engine.cli.flags import default_artifact
from ninfer_engine.config import EngineConfig
from ninfer_engine.kernels.cpu_decode import cpu_decode_unavailable
from ninfer_engine.types import GenerationRequest, SamplingParams

from .helpers import hf_state_dict

MODEL = default_artifact()
# the C step and transformers multiply the same (exactly dequantized) weights in fp32, in another
# summation order: 0.8e-4..3.4e-4 measured over 700 sampled steps at positions 945-1343; a wrong
# row, position, page or stale buffer moves logits by O(1)
LOGIT_ATOL = 1e-2

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not MODEL.exists(), reason=f"default model not prepared: {MODEL}"),
    pytest.mark.skipif(cpu_decode_unavailable() is not None, reason=f"{cpu_decode_unavailable()}"),
]


def _transformers(artifact):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = artifact.config("text")
    hf = LlamaForCausalLM._from_config(LlamaConfig(**cfg), attn_implementation="eager",
                                       dtype=torch.float32)
    state = hf_state_dict(artifact, cfg["num_hidden_layers"])
    state.pop("lm_head.weight", None)
    hf.load_state_dict(state, strict=False)
    hf.tie_weights()
    return hf.eval()


def test_sampled_rows_after_prefix_hits_match_the_fp32_reference(device, monkeypatch):
    if device.type != "cpu":
        pytest.skip("the compiled step is the CPU engine's")
    from ninfer_engine.artifact import open_artifact
    from ninfer_engine.engine import Engine
    from ninfer_engine.models import llama_cpu_step

    seen: list[tuple[str, int, torch.Tensor]] = []  # (request, position, logits row)
    load, step = llama_cpu_step.CpuDecoder.load, llama_cpu_step.CpuDecoder.step

    def spy_load(self, seqs, drafts=None):
        self.spied = [(s.request.request_id, s.cached) for s in seqs]
        return load(self, seqs, drafts)

    def spy_step(self, batch, bucket=0, q_len=1):
        logits = step(self, batch, bucket, q_len)
        seen.extend((rid, pos, logits[i].clone()) for i, (rid, pos) in enumerate(self.spied))
        return logits
    monkeypatch.setattr(llama_cpu_step.CpuDecoder, "load", spy_load)
    monkeypatch.setattr(llama_cpu_step.CpuDecoder, "step", spy_step)

    artifact = open_artifact(MODEL)
    engine = Engine(EngineConfig(artifact=MODEL, cpu_step="compiled"), artifact)
    assert isinstance(engine.runner.graphs.decoder, llama_cpu_step.CpuDecoder)
    # a prompt past one 64-token page, asked three times: the later ones hit the prefix tree,
    # including the pages the earlier answers' C steps wrote
    prompt = engine.tokenizer.encode(engine.chat_template.render([
        {"role": "system", "content": "You are a command-line assistant. " * 12},
        {"role": "user", "content": "Say hello in one short sentence."}]))
    engine.start()

    async def run(i):
        request = GenerationRequest(f"r{i}", tuple(prompt), SamplingParams(temperature=1.0, seed=i),
                                    max_tokens=24, ignore_eos=True)
        return [t async for e in engine.submit(request) for t in e.token_ids]
    try:
        outputs = {f"r{i}": asyncio.run(run(i)) for i in range(3)}
    finally:
        engine.stop()
    hf = _transformers(artifact)
    for rid, out in outputs.items():
        with torch.inference_mode():
            reference = hf(torch.tensor([prompt + out])).logits[0]
        rows = [(pos, logits) for r, pos, logits in seen if r == rid]
        # r0's first token comes from the prefill; the later ones restore all of the prompt
        # but its last token, which the C step computes with the decode rows
        assert len(rows) == len(out) - (rid == "r0")
        for pos, logits in rows:
            assert (logits - reference[pos]).abs().max() < LOGIT_ATOL, (rid, pos)
