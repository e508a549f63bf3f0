"""The verify chain (`step.verify_chain`) inside the engine: served the same with and without
it, captured on CUDA and uncaptured on the CPU graph step, rounds launched ahead, and the
lookahead's plain steps between rounds. (Apart from test_verify_chain.py, whose rigs drive
the chain directly: each file's CPU-engine tests take about a minute, so two CI workers share
them.)"""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.models.qwen3_5_engine_step import EngineHybridDecoder
from ninfer_engine.step.decode_graphs import DecodeGraphs
from ninfer_engine.step.mtp_drafter import MtpDrafter
from ninfer_engine.step.mtp_round import MtpRound

from .test_mtp_round import counting, served_both_ways
from .test_verify_chain import K, _Forced


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_the_engine_serves_the_same_with_and_without_the_chain_on_cuda(family, device):
    """Served bf16 on CUDA, `--spec mtp` verify rounds go through the captured chain (its
    graphs captured at load for every batch size); the same requests accepted on the host
    make the same rounds, drafts and greedy output (contexts within one graph bucket: the
    chain sizes its draft round's attention grid for j = k, the host's for the j it read)."""
    if device.type != "cuda":
        pytest.skip("the chain's engine path needs the CUDA graph step")

    def arrange(engine, chained):
        chain = engine.runner.chain
        assert (chain is not None) == chained
        if not chained:
            return []
        # batch sizes 1 and 2; greedy with and without penalties, and sampled as the
        # defaults below (top_k 20, a presence penalty): captured at load
        assert len(chain._graphs) == 6
        return counting(chain, "launch")
    # process defaults as the 35B-A3B preset's (the requests themselves are greedy)
    served_both_ways(family, lambda chained: {"verify_chain": chained, "temperature": 0.7,
                                              "top_k": 20, "presence_penalty": 1.5}, arrange)


def _cpu_graph_engine(monkeypatch, artifact, chained: bool, lookahead: bool = False,
                      max_concurrency: int = 1):
    """An engine on the CPU whose decode and verify rows take the hybrid graph step uncaptured
    (the Triton kernels interpreted), with its MTP round and (`chained`) the verify chain: what
    CUDA serves, but for capture. The model is the artifact's in bf16 over `FusedParams`. One
    request at a time: the MTP round's projections round differently at another batch size,
    which would move drafts at near-ties between the two paths."""
    from pathlib import Path

    from ninfer_engine import rank_parts
    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine
    from ninfer_engine.models.fused import FusedParams
    from ninfer_engine.models.qwen3_5 import Qwen35Model
    from ninfer_engine.step.spec_policy import AlwaysSpeculate

    def graphs(model, memory, kv_dtype, max_batch, max_context, use_graphs, max_q=1,
               keep_hidden=False, **_):
        return DecodeGraphs(EngineHybridDecoder(model, memory.storage, memory.running_slots,
                                                max_batch, max_context, max_q, keep_hidden),
                            capture=False)

    def bind(drafter, storage, graphs):
        d = graphs.decoder
        drafter.round = MtpRound(drafter.head, d.core.w.head, storage, drafter.layer,
                                 d.max_batch, d.max_context, d.max_q - 1, drafter.vocab, False)

    def source(name, shape):
        t = artifact.parameter(name, shape)
        return t if name.endswith(("a_log", "dt_bias")) else t.to(torch.bfloat16)

    monkeypatch.setattr(rank_parts, "build_decode_graphs", graphs)
    monkeypatch.setattr(MtpDrafter, "bind_step", bind)
    config = artifact.config("text")
    engine = Engine(EngineConfig(artifact=Path("t.ninfer"), max_context=512, prefill_chunk=16,
                                 max_concurrency=max_concurrency, spec="mtp", draft_tokens=K,
                                 verify_chain=chained, lookahead=lookahead),
                    artifact, model=Qwen35Model(config, FusedParams(config, source)))
    engine.speculator.policy = AlwaysSpeculate()
    engine.start()
    return engine


def test_the_engine_serves_the_same_through_the_chain_on_the_cpu_graph_step(monkeypatch):
    """The engine's whole round — drafting, leases, the verify step, acceptance, `keep`, the
    drafter's bookkeeping, rounds launched ahead of the one before, rows cut by their output
    limit inside a round — through the chain and through the host's acceptance, each taking
    the same drawn count of drafts a round (random weights accept none): the same drafts every
    round and the same tokens (CPU, the graph step uncaptured)."""
    import random

    from ninfer_engine.step import postprocess
    if torch.cuda.is_available():  # the kernels on CPU tensors need the interpreter (conftest)
        pytest.skip("CPU-only: on CUDA, test_the_engine_serves_the_same_with_and_without_the_"
                    "chain_on_cuda serves the same path captured")
    from .test_mtp_speculation import MtpArtifact
    from .test_speculation import _prompts, _run

    artifact, prompts, runs = MtpArtifact("qwen3_5"), _prompts(40)[:2], []
    for chained in (True, False):
        engine = _cpu_graph_engine(monkeypatch, artifact, chained)
        rounds: dict[str, int] = {}

        def count(seq) -> int:
            """A request's n-th round takes the same drawn count in both runs, whichever side
            (the chain at launch, the host at acceptance) asks and in whatever order."""
            n = rounds[seq.id] = rounds.get(seq.id, -1) + 1
            return random.Random(f"5/{seq.id}/{n}").randint(0, K)

        def counts(samplers):  # the host's rows name their request by its sampler
            by_sampler = {id(seq.sampler): seq for seq in engine.scheduler.running}
            return [count(by_sampler[id(sampler)]) for sampler in samplers]
        try:
            spec, runner, drafted, launched, ahead = engine.speculator, engine.runner, [], [], []
            keep = runner.keep  # each verify step's drafts, as it settles
            runner.keep = lambda batch, kept: drafted.append(
                [list(d) for d in batch.drafts]) or keep(batch, kept)
            # steps the host accepts (all of them unchained; rows the chain does not take:
            # drafts cut short near the output limit) take the chain's rule: j drafts (no
            # more than the row has: a draw past a cut-short row's drafts failed CI once),
            # then the target's pick after them
            monkeypatch.setattr(postprocess, "accept", lambda rows: [
                [*d[:j], int(rows_[j].argmax())]
                for (_, d, rows_), j in zip(rows, map(min, counts([r[0] for r in rows]),
                                                       [len(d) for _, d, _ in rows]))])
            if chained:
                launched = counting(engine.runner.chain, "launch")
                ahead = counting(engine.runner.chain, "launch_ahead")
                spec.drafter = _Forced(spec.drafter, None)
                spec.drafter.forced_counts = lambda d, seqs: [count(seq) for seq in seqs]
            tokens = _run(engine, prompts, 12)
        finally:
            engine.stop()
        runs.append((tokens, drafted, spec.counters.rounds, spec.counters.accepted))
        # rounds chained, and some launched ahead of the one before (`chain_ahead`)
        assert not chained or (launched and ahead
                               and len(launched) + len(ahead) <= spec.counters.rounds)
    assert runs[0] == runs[1]
    assert runs[0][3] > 0  # drafts were taken


def test_mtp_plain_steps_go_ahead_and_hand_the_drafter_their_hiddens(monkeypatch):
    """`--spec mtp` with the lookahead step (CPU, the graph step uncaptured): the steps the
    policy decodes plainly go ahead, the first 12 in a row (a row keeping page rows then
    runs its committed pairs, here past 6 pending, while the step in flight's input token is
    still on the device), then every third drafts; each plain step's hiddens reach the
    drafter as it launches. The same tokens as without the lookahead, rounds verified in
    both."""
    if torch.cuda.is_available():
        pytest.skip("CPU-only: the kernels on CPU tensors need the interpreter (conftest)")
    from ninfer_engine.step import mtp_drafter

    from .test_mtp_speculation import MtpArtifact
    from .test_speculation import _prompts, _run

    monkeypatch.setattr(mtp_drafter, "SPILL", 6)  # 32: as many steps again, interpreted

    class Late:
        asked = 0

        def speculate(self, batch):
            self.asked += 1
            return self.asked > 12 and self.asked % 3 == 0

        def record(self, *args):
            pass

    artifact, runs = MtpArtifact("qwen3_5"), []
    for lookahead in (False, True):
        engine = _cpu_graph_engine(monkeypatch, artifact, True, lookahead)
        engine.speculator.policy = Late()
        ahead, launch = [], engine.runner.forward_from
        engine.runner.forward_from = lambda batch, t: ahead.append(1) or launch(batch, t)
        try:
            tokens = _run(engine, _prompts(40)[:1], 22)
        finally:
            engine.stop()
        runs.append((tokens, engine.speculator.counters.rounds, len(ahead)))
    (plain, rounds, none), (tokens, rounds2, ahead) = runs
    assert tokens == plain and rounds > 0 and rounds2 > 0
    assert none == 0 and ahead > 10


def test_a_prompts_last_token_beside_verify_rows_runs_in_the_verify_graph(monkeypatch):
    """Two requests at once under `--spec mtp` (CPU, the graph step uncaptured): the second
    prompt's last token comes beside the first's verify row and runs as one more row of the
    verify graph (`runner._graph_tails`), so no step with drafts runs an eager forward (the
    prompt chunks before it do)."""
    if torch.cuda.is_available():
        pytest.skip("CPU-only: the kernels on CPU tensors need the interpreter (conftest)")
    from .test_mtp_speculation import MtpArtifact
    from .test_speculation import _prompts, _run

    engine = _cpu_graph_engine(monkeypatch, MtpArtifact("qwen3_5"), False, max_concurrency=2)
    runner, steps, eager_in = engine.runner, [], []
    forward, eager = runner.forward, runner._eager

    def step(batch):
        tails = [c for c in batch.chunks if c.seq.cached + 1 == len(c.seq.prompt)]
        steps.append((any(batch.drafts), len(tails)))
        return forward(batch)
    runner.forward = step
    runner._eager = lambda work, sampled: eager_in.append(steps[-1]) or eager(work, sampled)
    try:
        _run(engine, _prompts(40)[:2], 8)
    finally:
        engine.stop()
    assert (True, 1) in steps  # a verify step with a prompt's last token
    assert eager_in and not any(drafted for drafted, _ in eager_in)
