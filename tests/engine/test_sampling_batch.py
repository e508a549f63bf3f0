"""`sample_rows`: a whole step's rows at once must match the per-row rules of `filter_logits`."""
from __future__ import annotations

import asyncio
import dataclasses
import functools

import pytest
import torch

from ninfer_engine.step import sampling_paths, sampling_penalties
from ninfer_engine.kernels import sampling as kernels
from ninfer_engine.kernels._dispatch import HAVE_TRITON, interpreting
from ninfer_engine.step.sampling import Sampler, filter_logits, sample_rows
from ninfer_engine.step.sampling_penalties import apply_penalties
from ninfer_engine.step.sequence import Sequence, next_tokens
from ninfer_engine.types import GenerationRequest, SamplingParams
from tests.tolerance import TRANSCENDENTAL, bound

from .helpers import FakeArtifact
from .test_engine import _ascii_model, _collect, _engine, _request

V = 300


def _logits(rows: int, seed: int = 0, vocab: int = V) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def _reference_probs(row: torch.Tensor, p: SamplingParams, counts=None) -> torch.Tensor:
    """Today's per-row distribution: penalties, temperature, filter_logits, softmax."""
    row = apply_penalties(row, counts or {}, p.presence_penalty, p.frequency_penalty)
    return filter_logits(row.float() / p.temperature, p.top_k, p.top_p, p.min_p).softmax(-1)


def _probs_rtol(row: torch.Tensor, p: SamplingParams) -> float:
    """fp32 both ways, relative to each probability: the division by the temperature, the
    shift by the max and the exp (the shift's and division's rounding of an argument up to
    span / T is a relative error of e^x: span / T counts twice), the V-term sum (and the
    renormalising sum of the kept ones) and the divisions (`tests.tolerance`)."""
    t = p.temperature or 1.0
    span = (row.max() - row.min()).item() / t
    return bound(torch.float32, 2 + 2 * span + TRANSCENDENTAL + 2 * row.shape[-1] + 2)


def _batched_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """The batched path's filtered distribution over the vocabulary [B, V] (one path for all)."""
    samplers = [Sampler(p) for p in params]
    paths = {sampling_paths.path_of(p) for p in params}
    assert len(paths) == 1 and paths != {"greedy"}
    probs, ids = sampling_paths.CANDIDATES[paths.pop()](logits, samplers)
    out = torch.zeros_like(logits, dtype=torch.float32)
    out.scatter_(1, ids if ids is not None else torch.arange(logits.shape[1]).expand_as(out),
                 probs)
    return out / out.sum(-1, keepdim=True)


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's statistic over the categories with positive expected count."""
    expected = probs * counts.sum()
    live = expected > 0
    return float((((counts - expected)[live]) ** 2 / expected[live]).sum())


# --- greedy --------------------------------------------------------------------------------

def test_greedy_rows_equal_argmax_lowest_id_on_ties():
    logits = _logits(4)
    logits[1, [17, 250]] = 50.0  # a tie: the lower id wins
    logits[3, :] = 0.0  # all tied: id 0
    samplers = [Sampler(SamplingParams(temperature=0.0)) for _ in range(4)]
    assert sample_rows(logits, samplers) == logits.argmax(-1).tolist()
    assert sample_rows(logits, samplers)[1:] == [17, logits[2].argmax().item(), 0]


def test_greedy_rows_mixed_with_sampled_rows_keep_their_places():
    logits = _logits(5, seed=1).bfloat16()
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=5, seed=1),
              SamplingParams(temperature=0.0), SamplingParams(top_p=0.5, seed=2),
              SamplingParams(temperature=0.0)]
    tokens = sample_rows(logits, [Sampler(p) for p in params])
    assert [tokens[i] for i in (0, 2, 4)] == logits[[0, 2, 4]].argmax(-1).tolist()
    assert tokens[1] in logits[1].float().topk(5).indices.tolist()


# --- filtering: the same rules as filter_logits ---------------------------------------------

FILTERS = [
    SamplingParams(temperature=0.7, top_k=1),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_k=40, top_p=0.6),
    SamplingParams(temperature=0.5, top_k=200, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=20, top_p=0.9, min_p=0.1),
    SamplingParams(temperature=2.0, top_k=256, top_p=0.3),
]
FULL = [
    SamplingParams(temperature=0.8, top_p=0.7),
    SamplingParams(temperature=1.5, min_p=0.2),
    SamplingParams(temperature=1.0, top_k=280, top_p=0.95),  # above the cap, below V
    SamplingParams(temperature=0.9, top_k=V + 5, min_p=0.01),  # at least V: no top-k
]


@pytest.mark.parametrize("params", [FILTERS, FULL], ids=["top-k path", "full path"])
def test_filtered_distribution_equals_filter_logits(params):
    logits = _logits(len(params), seed=2)
    got = _batched_probs(logits, params)
    for row, p in enumerate(params):
        want = _reference_probs(logits[row], p)
        assert torch.equal(got[row] > 0, want > 0), p  # the same tokens survive
        torch.testing.assert_close(got[row], want, atol=0, rtol=_probs_rtol(logits[row], p))


def test_top_p_one_keeps_the_tail_and_top_k_one_is_argmax():
    logits = torch.zeros(1, V)
    logits[0, 7] = 30.0  # the fp32 cumsum is 1.0 after the first token, the tail is ~1e-13
    for params in ([SamplingParams(top_k=256, top_p=1.0)], [SamplingParams(min_p=1e-20)],
                   [SamplingParams()]):
        got = _batched_probs(logits, params)
        assert int((got > 0).sum()) == min(params[0].top_k or V, V)
    samplers = [Sampler(SamplingParams(top_k=1, seed=s)) for s in range(3)]
    assert sample_rows(_logits(3), samplers) == _logits(3).argmax(-1).tolist()
    # top_p 0 keeps the likeliest token alone on both paths (it kept none: the draw then took
    # a token of probability 0, one a grammar had masked: found by fuzzing the server)
    for top_k in (0, 20):
        samplers = [Sampler(SamplingParams(top_k=top_k, top_p=0.0, seed=s)) for s in range(3)]
        assert sample_rows(_logits(3), samplers) == _logits(3).argmax(-1).tolist(), top_k


# --- seeded determinism ----------------------------------------------------------------------

@pytest.mark.parametrize("params", [SamplingParams(top_k=5, seed=42),
                                    SamplingParams(top_p=0.9, seed=42),
                                    SamplingParams(temperature=1.2, seed=42)])
def test_same_seed_same_tokens_whatever_is_batched(params):
    steps = [_logits(1, seed=100 + t)[0] for t in range(30)]
    alone = Sampler(params)
    want = [alone.sample(row) for row in steps]
    # other requests around it change the batch size, its row and the top-k width (k = 128)
    others = [SamplingParams(temperature=0.0), SamplingParams(top_k=100, seed=1),
              SamplingParams(top_p=0.5, min_p=0.1, seed=2), SamplingParams(seed=3)]
    for position in (0, 2, 4):
        samplers = [Sampler(p) for p in others]
        mine = Sampler(params)
        samplers.insert(position, mine)
        got = []
        for t, row in enumerate(steps):
            batch = _logits(5, seed=200 + t)
            batch[position] = row
            got.append(sample_rows(batch, samplers)[position])
        assert got == want
    assert [Sampler(params).sample(steps[0]) for _ in range(3)] == [want[0]] * 3
    other_seed = Sampler(dataclasses.replace(params, seed=43))
    assert [other_seed.sample(row) for row in steps] != want


def test_next_tokens_takes_forced_tokens_and_samples_the_rest():
    def seq(budget=None, **kw):
        request = GenerationRequest("r", (1, 2), SamplingParams(**kw), thinking_budget=budget,
                                    thinking_close_ids=(7, 8))
        return Sequence(request, lambda event: None, Sampler(request.sampling), None,
                        frozenset())

    logits = _logits(3, seed=4)
    forced, greedy, sampled = seq(budget=0), seq(temperature=0.0), seq(top_k=3, seed=5)
    tokens = next_tokens([greedy, forced, sampled], logits)
    assert tokens[:2] == [logits[0].argmax().item(), 7]
    assert tokens[2] in logits[2].topk(3).indices.tolist()
    assert forced.sampler.counts == {7: 1} and list(forced.thinking_cap.forced) == [8]
    assert forced.next_token(logits[1]) == 8 and not forced.thinking_cap.forced


# --- the draw follows the filtered distribution ----------------------------------------------

@pytest.mark.parametrize("params", [SamplingParams(temperature=0.8, top_k=6, top_p=0.9),
                                    SamplingParams(temperature=1.5, top_k=12, min_p=0.1),
                                    SamplingParams(temperature=0.9, top_p=0.8),
                                    SamplingParams(temperature=1.0)])
def test_draws_follow_the_filtered_distribution(params):
    vocab, rows, rounds = 16, 2000, 5
    row = torch.linspace(2.0, -2.0, vocab)[torch.randperm(vocab, generator=torch.Generator()
                                                          .manual_seed(3))]
    want = _reference_probs(row, params).double()
    samplers = [Sampler(dataclasses.replace(params, seed=s)) for s in range(rows)]
    counts = torch.zeros(vocab, dtype=torch.float64)
    for _ in range(rounds):
        tokens = torch.tensor(sample_rows(row.expand(rows, vocab), samplers))
        counts += torch.bincount(tokens, minlength=vocab).double()
    assert bool((counts[want == 0] == 0).all())  # nothing outside the filter
    df = int((want > 0).sum()) - 1
    bound = df + 6 * (2 * df) ** 0.5 + 10  # far beyond chance for 10,000 draws and fixed seeds
    assert _chi_square(counts, want) < bound
    # the bound has power: the unfiltered or untempered distribution fails it
    unfiltered = row.double().softmax(-1)
    if not torch.allclose(unfiltered, want, atol=1e-3):  # a selector, not a parity check
        assert _chi_square(counts, unfiltered) > bound


# --- penalties --------------------------------------------------------------------------------

def test_penalties_apply_only_to_their_rows():
    logits = torch.tensor([[0.0, 0.0, 0.0, 1.5]]).repeat(2, 1)
    before = logits.clone()
    penalised = Sampler(SamplingParams(temperature=0.0, frequency_penalty=1.0))
    plain = Sampler(SamplingParams(temperature=0.0))
    steps = [sample_rows(logits, [penalised, plain]) for _ in range(3)]
    assert steps == [[3, 3], [3, 3], [0, 3]]
    assert torch.equal(logits, before)
    assert penalised.counts == {3: 2, 0: 1}


def test_penalised_sampled_rows_use_the_penalised_distribution():
    logits = _logits(2, seed=6)
    counts = {int(logits[0].argmax()): 3, 5: 1}
    p = SamplingParams(temperature=0.9, top_k=10, presence_penalty=0.5, frequency_penalty=2.0)
    penalised = sampling_penalties._penalized(logits, [Sampler(p), Sampler(p)])
    assert torch.equal(penalised, logits)  # no counts yet: untouched
    sampler = Sampler(p)
    for token, n in counts.items():
        for _ in range(n):
            sampler.record(token)
    penalised = sampling_penalties._penalized(logits, [sampler, Sampler(p)])
    assert torch.equal(penalised[0], apply_penalties(logits[0], counts, 0.5, 2.0))
    assert torch.equal(penalised[1], logits[1])
    got = _batched_probs(penalised, [p, p])
    torch.testing.assert_close(got[0], _reference_probs(logits[0], p, counts), atol=0,
                               rtol=_probs_rtol(penalised[0], p))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pending_pick_counts_as_if_recorded(dtype):
    """The lookahead step's penalties: each row's pick of the step in flight (on the device,
    not recorded yet) changes the logits exactly as recording it first would, whether the
    row's counts hold that token already (frequency only) or not (presence too); in bf16
    logits too (each penalized logit rounded once)."""
    logits = _logits(5, seed=8).to(dtype)
    params = [SamplingParams(temperature=0.0, presence_penalty=1.5),
              SamplingParams(temperature=0.0, presence_penalty=0.5, frequency_penalty=2.0),
              SamplingParams(temperature=0.0, frequency_penalty=0.75),
              SamplingParams(temperature=0.0),  # no penalties: untouched
              SamplingParams(temperature=0.9, presence_penalty=1.0)]  # nothing counted yet
    counts = [{7: 2, 3: 1}, {11: 1}, {7: 4}, {7: 1}, {}]
    pending = torch.tensor([7, 5, 7, 7, 2])  # held already, new, held, -, new

    def samplers(recorded: bool) -> list[Sampler]:
        out = []
        for p, c, token in zip(params, counts, pending.tolist()):
            sampler = Sampler(p)
            for counted, n in c.items():
                for _ in range(n):
                    sampler.record(counted)
            if recorded:
                sampler.record(token)
            out.append(sampler)
        return out
    ahead = sampling_penalties._penalized(logits, samplers(False), pending)
    assert torch.equal(ahead, sampling_penalties._penalized(logits, samplers(True)))
    assert torch.equal(ahead[3], logits[3]) and not torch.equal(ahead[4], logits[4])


def test_the_counted_arrays_follow_every_record():
    """`Sampler.counted`, the arrays the penalties copy in one go, follow `record`: a new
    token takes the next slot, a repeated one adds one; they match `counts` throughout."""
    sampler = Sampler(SamplingParams(temperature=0.0, presence_penalty=1.0))
    ids, times = sampler.counted()
    assert len(ids) == len(times) == 0
    for i, token in enumerate([5, 9, 5] + [1000 + j % 150 for j in range(300)]):
        sampler.record(token)
        if i in (2, 302):
            ids, times = sampler.counted()
            assert dict(zip(ids.tolist(), times.tolist())) == {
                token: float(n) for token, n in sampler.counts.items()}
    assert len(ids) == 152


# --- the Triton kernels behind the dispatch ---------------------------------------------------

@pytest.fixture
def triton_kernels(monkeypatch):
    """Route the dispatchers to the Triton kernels (CUDA, or the interpreter on the CPU), with
    small chunks so the two-stage reduction runs over several chunks."""
    if not HAVE_TRITON or not (torch.cuda.is_available() or interpreting()):
        pytest.skip("needs Triton on CUDA or TRITON_INTERPRET=1")
    monkeypatch.setattr(kernels, "topk", functools.partial(kernels.topk_triton, chunk=64))
    monkeypatch.setattr(kernels, "argmax", functools.partial(kernels.argmax_triton, chunk=64))
    return "cuda" if torch.cuda.is_available() else "cpu"


def test_triton_path_gives_the_torch_reference_tokens(triton_kernels):
    logits = _logits(6, seed=8)
    logits[0, [40, 200]] = 50.0  # a greedy tie across chunks
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=5, seed=1),
              SamplingParams(top_k=20, top_p=0.8, seed=2),
              SamplingParams(top_k=3, min_p=0.3, seed=3), SamplingParams(temperature=0.0),
              SamplingParams(top_p=0.9, seed=4)]

    def run(device) -> list[list[int]]:
        samplers = [Sampler(p) for p in params]
        return [sample_rows(logits.to(device), samplers) for _ in range(3)]

    got = run(triton_kernels)
    with pytest.MonkeyPatch.context() as mp:  # the torch references, on the same device
        mp.setattr(kernels, "topk", kernels.topk_ref)
        mp.setattr(kernels, "argmax", kernels.argmax_ref)
        want = run(triton_kernels)
    assert got == want
    assert all(step[0] == 40 for step in got)


def test_triton_top_k_candidates_match_filter_logits(triton_kernels):
    params = [p for p in FILTERS if p.top_k <= 40]  # k rounds per chunk: slow when interpreted
    logits = _logits(len(params), seed=9).to(triton_kernels)
    got = _batched_probs(logits, params).cpu()
    for row, p in enumerate(params):
        torch.testing.assert_close(got[row], _reference_probs(logits[row].cpu(), p), atol=0,
                                   rtol=_probs_rtol(logits[row].cpu(), p))


# --- the engine's call site ---------------------------------------------------------------------

def test_a_row_that_breaks_the_batched_call_fails_only_its_request(monkeypatch):
    uniform = Sampler.uniform

    def broken(self):
        if self.params.seed == 13:
            raise RuntimeError("broken generator")
        return uniform(self)

    monkeypatch.setattr(Sampler, "uniform", broken)
    engine = _engine(FakeArtifact(_ascii_model()), max_concurrency=3)

    async def trio():
        return await asyncio.gather(*(
            _collect(engine, _request(rid, 8, sampling=SamplingParams(top_k=5, seed=seed)))
            for rid, seed in (("bad", 13), ("good", 14), ("unseeded", None))))

    try:
        bad, good, unseeded = asyncio.run(trio())
    finally:
        engine.stop()
    assert bad[-1].finish == "error" and "broken generator" in bad[-1].error.message
    assert good[-1].finish == "length" and good[-1].usage.completion_tokens == 8
    assert unseeded[-1].finish == "length" and unseeded[-1].usage.completion_tokens == 8
