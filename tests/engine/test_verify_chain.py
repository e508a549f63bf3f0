"""`--spec mtp`'s verify chain (`step.verify_chain`): acceptance, GDN rollback and the next MTP
drafts on the device, against the host's acceptance, `keep` and drafter.

The chain and the host path run the same kernels on the same inputs (the verify step's logits,
its trail, the MTP round's pairs), so they agree exactly: tokens, drafts, GDN states and the
MTP layer's committed K/V bit for bit. On the CPU the steps run uncaptured through the Triton
interpreter; on CUDA they replay captured graphs.
"""
from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.kernels.paged_attention import PAGE
from ninfer_engine.kv import KvStorage, PagePool, codecs_for
from ninfer_engine.models.qwen3_5_engine_step import EngineHybridDecoder
from ninfer_engine.models.qwen3_5_step_weights import HybridWeights
from ninfer_engine.step.decode_graphs import DecodeGraphs
from ninfer_engine.step.mtp_drafter import MtpDrafter
from ninfer_engine.step.mtp_round import MtpRound
from ninfer_engine.step.family_runners import HybridRunner
from ninfer_engine.step.sampling import Sampler
from ninfer_engine.step.scheduler import Batch, Chunk
from ninfer_engine.step.acceptance import accept, split_verify_rows
from ninfer_engine.step.speculation import Speculator
from ninfer_engine.step.chain_accept import accept_on_device
from ninfer_engine.step.sampling_presets import qwen_preset
from ninfer_engine.step.verify_chain import VerifyChain, chainable, start_keys
from ninfer_engine.types import SamplingParams

from .helpers import stored_rows
from .test_hybrid_verify import _setup
from .test_mtp_round import _model as mtp_model
from .test_hybrid_graphs import _model

K, V = 3, 500  # drafts a row; the drafts' vocabulary
GREEDY = SamplingParams(temperature=0.0)


@pytest.mark.parametrize("moe", [False, True])
@torch.inference_mode()
def test_rollback_by_device_counts_is_keep_row_by_row(moe, device):
    """`HybridStep.keep_on_device` with every pair of kept counts (1 .. k + 1, both rows), and
    the host's `keep_rows` of the rows that roll back, leave each slot exactly as the host's
    `keep` of that row does."""
    model = _model(moe, device)
    _, _, seqs, graphs, drafts = _setup(model, "bf16", K, device.type == "cuda")
    graphs.verify(seqs, drafts)
    core, decoder = graphs.decoder.core, graphs.decoder
    after = [[t.clone() for t in seq.state.tensors()] for seq in seqs]
    moved = 0
    for kept in [(a, b) for a in range(1, K + 2) for b in range(1, K + 2)]:
        want = []
        for b, n in enumerate(kept):
            for seq, saved in zip(seqs, after):
                torch._foreach_copy_(seq.state.tensors(), saved)
            if n <= K:
                decoder.keep(b, n)
            want.append([t.clone() for t in seqs[b].state.tensors()])
        back = [(b, n) for b, n in enumerate(kept) if n <= K]
        # host rows: as the decoder was built (on CUDA the kernel, on the CPU row by row);
        # host rows, kernel: CUDA's branch wherever this runs (the CPU's through the interpreter)
        for by in ("device counts", "host rows", "host rows, kernel"):
            for seq, saved in zip(seqs, after):
                torch._foreach_copy_(seq.state.tensors(), saved)
            if by == "device counts":
                core.keep_on_device(torch.tensor(kept, device=device), len(seqs))
            elif back:
                built = decoder._kept
                if by == "host rows, kernel" and built is None:
                    decoder._kept = torch.zeros(decoder.max_batch, dtype=torch.long,
                                                device=device)
                decoder.keep_rows(back)
                decoder._kept = built
            for seq, expected, saved in zip(seqs, want, after):
                got = seq.state.tensors()
                assert all(torch.equal(x, y) for x, y in zip(got, expected)), (kept, by)
                moved += not all(torch.equal(x, y) for x, y in zip(got, saved))
    assert moved  # some count did take a row back


# a row of the rigs has penalties: the random models' logits spread ~0.3 at the top and never
# repeat a token, so a negative presence (counted tokens lead) is what makes them choose
PENALIZED = SamplingParams(temperature=0.0, presence_penalty=-1.0, frequency_penalty=0.3)


class _Scripted(Sampler):
    """A sampler whose uniforms repeat `values` (small ones take any draft among the
    candidates: random weights would take almost none)."""

    def __init__(self, params: SamplingParams, values: list[float]) -> None:
        super().__init__(params)
        self._values = itertools.cycle(values)

    def uniform(self) -> float:
        return next(self._values)


def _row(storage, states, prompt: list[int], sampler: Sampler):
    return SimpleNamespace(
        prompt=prompt, output=[], cached=0, cache=storage.new_cache(), state=states.acquire(),
        rope_delta=0, sampler=sampler, thinking_cap=None, draft_fallback=0,
        eos_token_ids=frozenset(), finish_reason=None, state_exact=True,
        request=SimpleNamespace(media=None, prompt_logprobs=None, prompt_cache=False))


class _Forced:
    """The drafter with a chosen count of drafts taken per round (random weights accept
    nothing): `forced_counts` for the chain; the host side applies the same `plan`."""

    def __init__(self, drafter, plan) -> None:
        self.drafter, self.plan = drafter, plan

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def forced_counts(self, drafts, seqs):
        return next(self.plan)


def _rig(moe: bool, chained: bool, forced, prompts: tuple[int, ...], seed: int, device,
         rows: bool = False, penalized: int = 0, samplers=None):
    """Two greedy rows of random prompts of these lengths, prefilled through the eager forward
    (which hands the drafter their hiddens), on a runner with the graph step, the MTP round and
    (`chained`) the verify chain, the drafter's counts `forced`; (storage, drafter, speculator,
    runner, rows). `rows`: the pool keeps drafter rows (prefix reuse); row `penalized` has
    presence and frequency penalties; `samplers()`: the rows' samplers instead."""
    model, head = mtp_model(moe, device)
    layers, heads, dim = model.kv_layout()
    storage = KvStorage(PagePool(16, PAGE), layers + 1, heads, dim,
                        codecs_for("bf16", model.dtype), model.dtype, device,
                        row_width=model.config["hidden_size"] if rows else 0)
    states = model.state_pool(3)
    capture = device.type == "cuda"
    graphs = DecodeGraphs(EngineHybridDecoder(model, storage, states, 2, 512, max_q=K + 1,
                                              keep_hidden=True), capture)
    drafter = MtpDrafter(head, V)
    drafter.round = MtpRound(head, HybridWeights(model, model.params).head, storage,
                             drafter.layer, 2, 512, K, V, capture)
    speculator = Speculator("mtp", K, drafter)
    runner = HybridRunner(model, graphs, speculator.observe)
    if chained:
        speculator.drafter = _Forced(drafter, forced)
        runner.chain = VerifyChain(graphs, speculator, capture)
    gen = torch.Generator().manual_seed(seed)
    given = samplers() if samplers else [Sampler(PENALIZED if b == penalized else GREEDY)
                                         for b in range(len(prompts))]
    seqs = [_row(storage, states, torch.randint(0, V, (n,), generator=gen).tolist(), sampler)
            for n, sampler in zip(prompts, given)]
    for seq in seqs:
        assert seq.cache.reserve(len(seq.prompt))
        logits = runner.forward(Batch([], [Chunk(seq, len(seq.prompt))], [seq]))
        _emit(seq, [int(logits[0].argmax())])
    return storage, drafter, speculator, runner, seqs


def _emit(seq, tokens: list[int]) -> None:
    """Tokens out, counted for the penalties (postprocess's part)."""
    seq.output.extend(tokens)
    for t in tokens:
        seq.sampler.record(t)


def _host_picks(seq, drafts: list[int], logits: torch.Tensor) -> list[int]:
    """The host's greedy choice at each position of a verify row, penalties with the drafts
    before it counted (`accept_greedy`'s)."""
    from ninfer_engine.step.acceptance import _position_views
    from ninfer_engine.step.sampling_penalties import _penalized
    from ninfer_engine.step.grammar_drafts import masked

    views = _position_views(seq.sampler, drafts, logits.shape[0])
    return masked(seq.sampler, drafts, _penalized(logits, views)).argmax(-1).tolist()


def _serve(moe: bool, chained: bool, plan: list, device, rows: bool, samplers=None):
    """Two rows (greedy, or `samplers()`') through prompt, then verify rounds of `plan`'s
    forced counts (None: acceptance by agreement), the host's `accept` and `keep` or the
    chain; (tokens, the drafts of every round, GDN states, committed MTP K/V, pending
    hiddens)."""
    forced = iter([[None] * 2 if c is None else c for c in plan])
    storage, drafter, speculator, runner, seqs = _rig(moe, chained, forced, (9, 60), 8, device,
                                                      rows, samplers=samplers)
    proposed, moved = [], 0  # moved: host rounds where the penalties changed a pick
    for forced in plan:
        for seq in seqs:
            assert seq.cache.reserve(seq.cached + 2 * K + 1)
        drafts = speculator.draft_rows(seqs, [K, K])
        proposed.append(drafts)
        batch = Batch(seqs, [], list(seqs), drafts)
        logits = runner.forward(batch)
        assert (runner.chain is not None and runner.chain.owns(seqs)) == chained
        _, verified = split_verify_rows(batch, logits)
        emitted = runner.accepted(seqs)
        if emitted is None:
            emitted = accept([(s.sampler, *verified[id(s)]) for s in seqs])
            if forced is not None:  # the chain's rule: j drafts, then the target's pick there
                emitted = [[*d[:j], _host_picks(s, d, verified[id(s)][1])[j]]
                           for s, d, j in zip(seqs, drafts, forced)]
            moved += any(p != int(a) for p, a in zip(_host_picks(seqs[0], drafts[0],
                                                                 verified[id(seqs[0])][1]),
                                                     verified[id(seqs[0])][1].argmax(-1)))
        for seq, tokens in zip(seqs, emitted):
            _emit(seq, tokens)
        runner.keep(batch, [len(t) for t in emitted])
    # the next round's drafts: the host path runs the last round's pairs now (the chain did)
    proposed.append(speculator.draft_rows(seqs, [K, K]))
    mtp = [stored_rows(storage, drafter.layer, is_k, seq.cache._slots(0, seq.cached))
           for seq in seqs for is_k in (True, False)]
    held = [storage.rows[seq.cache._slots(0, seq.cached)].clone() for seq in seqs] if rows \
        else []
    return ([s.output for s in seqs], proposed, [t.clone() for s in seqs for t in
                                                 s.state.tensors()], mtp, held, moved)


# the MoE head interpreted: ~200 s on the 2-core box, run with -m slow
@pytest.mark.parametrize("moe", [False, pytest.param(True, marks=pytest.mark.slow)])
@torch.inference_mode()
def test_the_chain_serves_exactly_what_the_host_path_does(moe, device):
    """Rounds that keep 4 and 1, then 2 and 3, then by agreement, then 1 and 4 tokens: the
    chain's rows emit the host path's tokens, verify the host path's drafts each round, and
    leave the same GDN states and committed MTP K/V and drafter rows. Row 0 has presence and
    frequency penalties (which change some of the host's picks), row 1 none."""
    plan = [(3, 0), (1, 2), None, (0, 3)]
    host = _serve(moe, False, plan, device, rows=True)
    chain = _serve(moe, True, plan, device, rows=True)
    assert chain[0] == host[0] and chain[1] == host[1]
    assert all(len(d) == K for step in host[1] for d in step)
    assert [len(o) for o in host[0]] == [1 + 4 + 2 + 1 + 1, 1 + 1 + 3 + 1 + 4]
    assert host[5] > 0  # the penalties did change the host's choice somewhere
    for name, a, b in zip(("states", "MTP K/V", "drafter rows"), chain[2:5], host[2:5]):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), name


@torch.inference_mode()
def test_a_sampled_row_through_the_chain_is_served_as_the_host_path_serves_it(device):
    """A row sampling through the top-k path (with a presence penalty, as the Qwen presets)
    beside a greedy row, rounds by the rejection test and by agreement: the chain draws the
    same uniforms at launch that the host's acceptance draws after the step, and emits the
    same tokens and drafts, leaving the same states. Its uniforms are scripted small for two
    tests a round (a draft among the candidates is taken) and larger after. A round's first
    draft is among the random model's 256 candidates about half the time, so 8 rounds take
    one with all but ~0.4 % of numerics (4 rounds missed on the H100 once q and k of a prompt's
    GDN layers were stored in bf16)."""
    def samplers():
        return [_Scripted(SamplingParams(temperature=1.0, top_k=256, presence_penalty=0.5,
                                         seed=4), [0.0, 0.0, 0.7, 0.4]), Sampler(GREEDY)]
    plan = [None] * 8
    host = _serve(False, False, plan, device, rows=False, samplers=samplers)
    chain = _serve(False, True, plan, device, rows=False, samplers=samplers)
    assert chain[0] == host[0] and chain[1] == host[1]
    assert len(host[0][0]) > 1 + len(plan)  # the sampled row took drafts
    for name, a, b in zip(("states", "MTP K/V"), chain[2:4], host[2:4]):
        assert all(torch.equal(x, y) for x, y in zip(a, b)), name


@torch.inference_mode()
def test_a_row_the_host_ends_inside_the_round_keeps_its_own_count(device):
    """The host keeps fewer tokens than the device accepted (an end token among the drafts):
    `settle` takes that row's state back to them from the trail, and its drafter row holds no
    drafts of the device's; the other row goes on with the chain's."""
    sides = []
    for chained in (False, True):
        _, drafter, speculator, runner, seqs = _rig(False, chained, iter([[3, 3]]), (12, 20), 2,
                                                    device)
        for seq in seqs:
            assert seq.cache.reserve(seq.cached + 2 * K + 1)
        drafts = speculator.draft_rows(seqs, [K, K])
        batch = Batch(seqs, [], list(seqs), drafts)
        logits = runner.forward(batch)
        emitted = runner.accepted(seqs) if chained else [
            [*d, _host_picks(s, d, rows)[K]] for s, (d, rows) in
            ((s, split_verify_rows(batch, logits)[1][id(s)]) for s in seqs)]
        emitted[0] = emitted[0][:2]  # row 0 ends at its second token
        runner.keep(batch, [len(t) for t in emitted])
        row = drafter._rows[id(seqs[0])]
        assert [s.cached for s in seqs] == [12 + 2, 20 + K + 1]
        assert row.done == (14 if chained else 12)  # the host path's pairs run at its next draft
        assert not chained or (row.drafted is None
                               and len(drafter._rows[id(seqs[1])].drafted) == K)
        sides.append([t.clone() for s in seqs for t in s.state.tensors()])
    assert all(torch.equal(x, y) for x, y in zip(*sides))


@torch.inference_mode()
def test_a_round_launched_ahead_settles_as_the_host_path(device):
    """Round 1 chained, round 2 launched from its device outputs before round 1 is read
    (`launch_ahead`); then round 1 settles with row 0 ended on its bonus (as on an end token)
    and row 1 going on, then round 2 for row 1. Against two host rounds of both rows (row 0's
    second keeping 1 token): row 1's tokens, drafts and state are the host path's, and row 0's
    state and `cached` cover its bonus (as a lookahead row's last token). Row 1 has penalties:
    round 2's count round 1's tokens on the device, before the host has recorded them."""
    # the host's; the device takes 2 of row 0's in round 2. Row 1 takes every draft, then
    # none: its round-2 token is its pick after round 1's, penalized by their counts
    plan = [(2, 3), (0, 0)]
    sides = []
    for chained in (False, True):
        storage, drafter, speculator, runner, seqs = _rig(False, chained,
                                                          iter([plan[0], (2, 0)]), (11, 30),
                                                          4, device, penalized=1)
        for seq in seqs:
            assert seq.cache.reserve(seq.cached + 4 * K + 4)
        drafts = speculator.draft_rows(seqs, [K, K])
        batch = Batch(seqs, [], list(seqs), drafts)
        logits = runner.forward(batch)
        verified = split_verify_rows(batch, logits)[1]
        if chained:
            ahead = runner.forward_ahead(batch)
            emitted = runner.accepted(seqs)
        else:
            emitted = [[*d[:j], _host_picks(s, d, verified[id(s)][1])[j]]
                       for s, d, j in zip(seqs, drafts, plan[0])]
        for seq, tokens in zip(seqs, emitted):
            _emit(seq, tokens)
        seqs[0].finish_reason = "stop" if chained else None
        runner.keep(batch, [len(t) for t in emitted])
        if chained:  # round 2's drafts came with round 1's results; row 0 ended
            second = Batch(seqs, [], list(seqs), runner.chain.ahead_drafts())
            emitted = runner.accepted(seqs[1:])
            _emit(seqs[1], emitted[0])
            runner.keep(Batch(seqs[1:], [], seqs[1:], second.drafts[1:]), [len(emitted[0])])
            assert ahead.shape[0] == 2 * (K + 1) and seqs[0].state_exact
        else:
            second = Batch(seqs, [], list(seqs), speculator.draft_rows(seqs, [K, K]))
            logits = runner.forward(second)
            verified = split_verify_rows(second, logits)[1]
            emitted = [[*d[:j], _host_picks(s, d, verified[id(s)][1])[j]]
                       for s, d, j in zip(seqs, second.drafts, plan[1])]
            for seq, tokens in zip(seqs, emitted):
                _emit(seq, tokens)
            runner.keep(second, [1, len(emitted[1])])
            seqs[0].output = seqs[0].output[:-1]  # row 0 ended on round 1's bonus
        sides.append(([s.output for s in seqs], [s.cached for s in seqs], second.drafts,
                      [t.clone() for s in seqs for t in s.state.tensors()]))
    (out, cached, drafts, states), (out2, cached2, drafts2, states2) = sides
    assert out2 == out and cached2 == cached and drafts2 == drafts
    assert all(torch.equal(x, y) for x, y in zip(states, states2))


def test_acceptance_on_the_device_is_the_hosts_rule():
    """Every pattern of agreement over k = 3 drafts, against `accept_greedy`'s rule (the
    longest agreeing prefix, then the pick after it); an end token among the accepted drafts
    cuts acceptance before it and goes out as the bonus (the tokens the host emits, stopping
    there); a forced count is taken as it is."""
    from itertools import product

    from ninfer_engine.step.sampling import Sampler as HostSampler
    from ninfer_engine.step.acceptance import accept_greedy

    picks = torch.tensor([[5, 6, 7, 8]])
    for agree in product([True, False], repeat=K):
        drafts = torch.tensor([[p if a else 9 for p, a in zip([5, 6, 7], agree)]])
        logits = torch.full((K + 1, 10), -1.0)
        logits[torch.arange(K + 1), picks[0]] = 1.0
        [want] = accept_greedy([(HostSampler(GREEDY), drafts[0].tolist(), logits)])
        none = torch.zeros(1, K, dtype=torch.bool)
        j, bonus = accept_on_device(drafts, picks, torch.tensor([-1]), none)
        assert [*drafts[0, : int(j)].tolist(), int(bonus)] == want, agree
        for end in range(K):  # draft `end` is an end token
            ends = none.clone()
            ends[0, end] = True
            j, bonus = accept_on_device(drafts, picks, torch.tensor([-1]), ends)
            tokens = [*drafts[0, : int(j)].tolist(), int(bonus)]
            stop = next((i for i, t in enumerate(want) if i == end and i < len(want) - 1),
                        None)  # the host stops at the end token where it was accepted
            assert tokens == (want if stop is None else want[: stop + 1]), (agree, end)
    j, bonus = accept_on_device(torch.tensor([[9, 9, 9]]), picks, torch.tensor([2]),
                                torch.zeros(1, K, dtype=torch.bool))
    assert (int(j), int(bonus)) == (2, 7)


def test_penalized_picks_on_the_device_are_the_hosts():
    """`ChainPenalties.picks` against `accept_greedy`'s choice at each position (penalties over
    the generated tokens and the drafts before the position): rows with presence, frequency,
    negative and no penalties, drafts repeated and drafts already counted. The counted tokens
    and drafts lead the logits, so the penalties move picks (checked)."""
    from ninfer_engine.step.chain_penalties import ChainPenalties

    gen = torch.Generator().manual_seed(3)
    vocab, settings = 40, [(1.5, 0.0), (0.5, 0.7), (-0.4, 0.3), (0.0, 0.0)]
    seqs, drafts = [], []
    for presence, frequency in settings:
        sampler = Sampler(SamplingParams(temperature=0.0, presence_penalty=presence,
                                         frequency_penalty=frequency))
        for t in torch.randint(0, 6, (7,), generator=gen).tolist():  # repeats among 0..5
            sampler.record(t)
        seqs.append(SimpleNamespace(sampler=sampler, thinking_cap=None))
        drafts.append(torch.randint(3, 9, (K,), generator=gen).tolist())
    logits = torch.randn(len(seqs), K + 1, vocab, generator=gen)
    logits[:, :, :9] += 2.5  # the counted tokens and drafts lead
    penalties = ChainPenalties(len(seqs), K + 1, vocab, torch.device("cpu"))
    penalties.load(seqs)
    penalties.take(logits)
    got = penalties.picks(torch.tensor(drafts))
    want = [_host_picks(seq, d, row) for seq, d, row in zip(seqs, drafts, logits)]
    assert got.tolist() == want
    assert got[:3].ne(logits[:3].argmax(-1)).any()  # penalties changed some picks
    assert got[3].equal(logits[3].argmax(-1))  # and none without them
    # a round's tokens counted (twice, as a capture's warm-up and its replay): the next
    # round's counts have them once
    before = penalties.counts.clone()
    for _ in range(2):
        penalties.count(torch.tensor(drafts), torch.tensor([0, 1, 3, 2]), torch.tensor([9] * 4))
    assert penalties.counts.equal(before)
    penalties.advance(4)
    added = penalties.counts - before
    assert added.sum(1).tolist() == [1, 2, 4, 3] and added[:, 9].tolist() == [1] * 4


def test_sampled_acceptance_on_the_device_is_the_hosts():
    """`ChainSampling.accept` against `accept_sampled` on the same logits, drafts and seeded
    uniforms (the device side's samplers draw the round's at load, from the same seeds): rows
    of the top-k path with top-p, min-p, a temperature, presence and frequency penalties, and
    none of them; a greedy row beside them; drafts among each position's likeliest tokens (so
    that many are taken) or not; an end token among one row's drafts. Every round emits the
    host's tokens."""
    from ninfer_engine.step.chain_accept import ChainSampling
    from ninfer_engine.step.chain_penalties import ChainPenalties
    from ninfer_engine.step.acceptance import accept

    gen = torch.Generator().manual_seed(5)
    vocab = 64
    settings = [dict(temperature=0.8, top_k=20, top_p=0.9, presence_penalty=1.5, seed=1),
                dict(temperature=1.3, top_k=40, min_p=0.05, seed=2),
                dict(temperature=0.6, top_k=5, frequency_penalty=0.4, seed=3),
                dict(temperature=0.0, presence_penalty=0.5)]
    host = [Sampler(SamplingParams(**kw)) for kw in settings]
    chain = [Sampler(SamplingParams(**kw)) for kw in settings]
    device = torch.device("cpu")
    penalties = ChainPenalties(len(host), K + 1, vocab, device)
    sampling = ChainSampling(len(host), K, device)
    taken = drawn = 0
    for _ in range(150):
        logits = torch.randn(len(host), K + 1, vocab, generator=gen) * 4.0
        top = logits.topk(2, -1).indices
        drafts = [[int(top[b, i, int(torch.rand((), generator=gen) < 0.2)])
                   if torch.rand((), generator=gen) < 0.9 else
                   int(torch.randint(0, vocab, (), generator=gen)) for i in range(K)]
                  for b in range(len(host))]
        want = accept([(s, d, row) for s, d, row in zip(host, drafts, logits)])
        seqs = [SimpleNamespace(sampler=s) for s in chain]
        penalties.load(seqs)
        penalties.take(logits)
        sampling.load(seqs)
        d = torch.tensor(drafts)
        ends = torch.zeros(len(host), K, dtype=torch.bool)
        ends[1] = d[1] == drafts[1][1]  # row 1 stops at its second draft's token
        penalized = penalties.logits_of(d, True)
        picks = penalized.argmax(-1)
        j, bonus = sampling.accept(penalized, picks, d, torch.full((len(host),), -1), ends,
                                   ChainSampling.candidates(seqs, vocab))
        for b, tokens in enumerate(want):
            got = [*drafts[b][: int(j[b])], int(bonus[b])]
            stop = next((i for i, t in enumerate(tokens) if ends[b, i % K] and i < K
                         and i < len(tokens) - 1), None)
            assert got == (tokens if stop is None else tokens[: stop + 1]), (b, tokens, got)
            taken += len(tokens) - 1
            drawn += 1
        for s, h, tokens in zip(chain, host, want):  # both record what the round emitted
            for t in tokens:
                s.record(t)
                h.record(t)
    assert drawn / 2 < taken < K * drawn  # drafts taken and drafts rejected, many of each


def test_the_chains_captured_at_start_are_greedy_and_the_served_presets():
    def preset(hidden, experts, thinking):
        arch = "Qwen3_5MoeForCausalLM" if experts else "Qwen3_5ForCausalLM"
        values = qwen_preset({"architectures": [arch], "hidden_size": hidden,
                              "num_experts": experts}, thinking)
        return SamplingParams(**values)
    vocab = 248_320
    dense = [preset(5120, None, t) for t in (True, False)]  # presence 0 thinking, 1.5 not
    assert start_keys(dense, vocab) == [(False, 0), (False, 32), (True, 0), (True, 32)]
    moe = [preset(2048, 256, t) for t in (True, False)]
    assert start_keys(moe, vocab) == [(False, 0), (True, 0), (True, 32)]
    neutral = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.0)]
    assert start_keys(neutral, vocab) == [(False, 0), (True, 0)]
    assert start_keys([SamplingParams(temperature=0.5, top_k=5)], 16) == [
        (False, 0), (False, 8), (True, 0)]


@torch.inference_mode()
def test_the_chain_captures_at_start_each_of_the_decode_graphs_start_buckets():
    """`VerifyChain.capture_at_start`: a verify step of scratch rows for each batch size, then
    its chain at each context bucket the decode graphs captured at load (without them, the
    first) for each start key, on one page given back; the steps spied."""
    model, _ = mtp_model(False, torch.device("cpu"))
    layers, heads, dim = model.kv_layout()
    pool = PagePool(4, PAGE)
    storage = KvStorage(pool, layers + 1, heads, dim, codecs_for("bf16", model.dtype),
                        model.dtype, model.device)
    graphs = DecodeGraphs(EngineHybridDecoder(model, storage, model.state_pool(2), 2, 3000,
                                              max_q=K + 1, keep_hidden=True), capture=False)
    chain = VerifyChain(graphs, SimpleNamespace(drafter=None), capture=False)
    calls = []

    def verify(seqs, drafts):
        calls.append(("verify", len(seqs)))
        return torch.zeros(len(seqs), K + 1, V)
    graphs.verify = verify
    chain._run = lambda *key: calls.append(key)
    graphs.start_buckets = (1024, 2048)
    chain.capture_at_start()
    keys = [(False, 0), (True, 0)]  # greedy without and with penalties
    assert calls == [c for b in (1, 2) for c in [("verify", b)] + [
        (b, bucket, *key) for bucket in (1024, 2048) for key in keys]]
    assert pool.free == pool.total
    calls.clear()
    graphs.start_buckets = ()
    chain.capture_at_start()
    assert calls == [c for b in (1, 2) for c in [("verify", b)] + [(b, 1024, *key)
                                                                   for key in keys]]


def test_chainable_rows_are_greedy_or_top_k_sampled_without_grammar_or_logprobs():
    def row(**kw):
        return SimpleNamespace(sampler=Sampler(SamplingParams(**kw)), thinking_cap=None)
    assert chainable(row(temperature=0.0))
    assert chainable(row(temperature=0.7, top_k=20, top_p=0.95))
    assert not chainable(row(temperature=0.7))  # the full-vocabulary paths stay on the host
    assert not chainable(row(temperature=0.7, top_p=0.9))
    assert chainable(row(temperature=0.0, presence_penalty=1.5, frequency_penalty=0.1))
    logged = row(temperature=0.0)
    logged.sampler = Sampler(GREEDY, logprobs=2, logprob_sink=[])
    assert not chainable(logged)
    capped = row(temperature=0.0)
    capped.thinking_cap = object()
    assert not chainable(capped)
