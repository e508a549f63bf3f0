"""`--spec mtp`'s static draft round (`models.mtp_step.MtpStep` through `step.mtp_round`)
against the eager MTP head (`models.mtp.MtpHead`, as `MtpDrafter` runs it) over the same KV
pool, whose last attention layer is the MTP layer's (`step.mtp_drafter`).

Two rows: one whose four committed pairs (a verify row that kept all three drafts) cross a page,
one with a single pair (a row that kept none), each over MTP K/V of earlier pairs already in its
pages. The first is a media prompt's: past its prompt its rotary positions are shifted by its
rope delta, which the eager head is given as positions and the round as shifts. The round's
K/V writes at the real pairs' and the drafts' positions and each draft's MTP output are
compared with the eager head fed the round's own drafts, and each draft with the argmax of the
eager head's logits over that output. On the CPU the step runs the Triton kernels through the
interpreter; on CUDA it replays a captured graph.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.kernels.paged_attention import PAGE
from ninfer_engine.kv import KvStorage, LayerKv, PagePool, codecs_for
from ninfer_engine.models.mtp import MtpHead
from ninfer_engine.models.qwen3_5_step_weights import HybridWeights
from ninfer_engine.step.mtp_round import MtpRound
from tests import tolerance
from tests.benchmark.tiny import tiny_source

from .helpers import cuda_syncs, stored_rows
from .test_hybrid_graphs import _model as hybrid_model

BF16 = torch.bfloat16
K = 3
# bf16 stores on each side up to a pair's K/V: the embedding's and the hidden's norms, the
# input projection, the layer's input norm, its q|gate|k|v projection, the k norm and RoPE (7);
# up to a draft step's input (the MTP output before it): those, the attention's dot operands K,
# V and P, its output, gate and product, the output projection, the residual, the norm, the
# FFN's four stores (or the experts' weights and sum), the residual and the final norm (22),
# twice (the pairs' pass, then a draft step's); `cast_roundings()` each
KV_STORES, OUTPUT_STORES = 7, 2 * 22


def _model(moe: bool, device):
    """`test_hybrid_graphs`' tiny model (every expert routed) and an MTP head over it."""
    model = hybrid_model(moe, device)
    source = tiny_source(model.config, mtp=True)
    return model, MtpHead(model, lambda n, s: source(n, s).to(device))


def _tols(model, context: int) -> tuple[float, float, float]:
    """(K/V write, MTP output, head logits) bounds: each side's fp32 chain, stored in bf16 as
    above. The outputs' worst case over 44 stores (~1.05 interpreted) bounds nothing, so they
    take the probabilistic bound λ·√n·u per side (Higham & Mary 2019; λ = 6, as
    tests/kernels/test_decode_stack.py): ≈ 0.44 interpreted, where a wrong row, position or
    page is ~1 off. The head: one length-H dot and one store."""
    c = model.config
    H, D = c["hidden_size"], c["head_dim"]
    width = c.get("moe_intermediate_size") or c["intermediate_size"]
    kv_depth = 3 * H + 2 * H + D + 2 * tolerance.TRANSCENDENTAL
    layer = (kv_depth + D * math.sqrt(D) + 2 * context + c["num_attention_heads"] * D
             + 2 * H + width + c.get("num_experts", 0) + H + tolerance.TRANSCENDENTAL)
    cast = tolerance.cast_roundings()
    return (tolerance.bound(BF16, kv_depth, roundings=KV_STORES * cast),
            tolerance.bound(BF16, 2 * layer, roundings=OUTPUT_STORES * cast, probabilistic=6),
            tolerance.bound(BF16, H, roundings=cast))


def _media_prompt(length: int):
    """A media prompt of `length` tokens whose 16 image tokens (16..31) take the positions of
    their 4 × 4 grid (16..19 on the height and width axes), so the text after them goes on
    from 20: past the image a position t rotates as t - 12 on every axis (its rope delta)."""
    from ninfer_engine.vision.prompt import MediaPrompt, Span

    positions = torch.arange(length).expand(3, -1).clone()
    positions[:, 16:32] = torch.stack([torch.full((16,), 16), torch.arange(16) // 4 + 16,
                                       torch.arange(16) % 4 + 16])
    positions[:, 32:] -= 12
    return MediaPrompt((), (Span(0, 16, 16, 0),), positions, -12)


def _history(head, layer, seq, done: int, gen, device) -> None:
    """The MTP K/V of pairs 0..done-1 of random hiddens and tokens, as the eager head runs
    them into `seq`'s pages."""
    H = head.target.config["hidden_size"]
    tokens = torch.randint(0, 512, (done,), generator=gen).to(device)
    hidden = torch.randn(done, H, generator=gen).to(device, BF16)
    head(tokens, hidden, [LayerKv(seq.cache, layer, 0)], [done],
         torch.arange(done, device=device))


@pytest.mark.parametrize("moe,shortlist", [(False, False), (True, False), (False, True)])
@torch.inference_mode()
def test_the_static_draft_round_matches_the_eager_head(moe, shortlist, device):
    """(`shortlist`: drafts over 200 of the head's rows, as `--lm-head-draft` has them.)"""
    from ninfer_engine.step.draft_head import IndexedDraftHead

    model, head = _model(moe, device)
    layers, heads, dim = model.kv_layout()
    storage = KvStorage(PagePool(8, PAGE), layers + 1, heads, dim,
                        codecs_for("bf16", model.dtype), model.dtype, device)
    layer, H, V = layers, model.config["hidden_size"], 500  # drafts among the first 500 ids
    gen = torch.Generator().manual_seed(11)
    rows = []
    media = _media_prompt(40)
    for done, n, prompt in ((61, 4, media), (5, 1, None)):  # pairs 61..64 cross the first page
        seq = SimpleNamespace(cache=storage.new_cache(), request=SimpleNamespace(media=prompt),
                              rope_delta=0 if prompt is None else prompt.rope_delta)
        assert seq.cache.reserve(done + n + K)  # through L + k, as the engine leases it
        _history(head, layer, seq, done, gen, device)
        rows.append((seq, torch.randint(0, 512, (n,), generator=gen).tolist(),
                     torch.randn(n, H, generator=gen).to(device, BF16), done))
    ids = torch.randperm(V, generator=gen)[:200].to(device) if shortlist else torch.arange(V)
    draft_head = (IndexedDraftHead(model.head_projection.weight[ids].contiguous(), ids, BF16)
                  if shortlist else None)
    steps = MtpRound(head, HybridWeights(model, model.params).head, storage, layer, 2, 512, K,
                     V, capture=device.type == "cuda", draft_head=draft_head)
    assert steps.takes([r[0] for r in rows], [done + len(t) for _, t, _, done in rows])
    before = [t.clone() for t in (storage.k[layer][0], storage.v[layer][0])]
    drafts = steps.propose([r[0] for r in rows], [r[1:] for r in rows])
    ours = [t.clone() for t in (storage.k[layer][0], storage.v[layer][0])]
    outputs = steps.step.outputs[:, :2].clone()  # each draft's MTP output
    for stored, saved in zip((storage.k[layer][0], storage.v[layer][0]), before):
        stored.copy_(saved)
    kv_tol, out_tol, head_tol = _tols(model, 64 + 4 + K)
    checked = 0
    for b, (seq, tokens, hidden, done) in enumerate(rows):
        n, last, delta = len(tokens), done + len(tokens), seq.rope_delta
        h = head(torch.tensor(tokens, device=device), hidden, [LayerKv(seq.cache, layer, done)],
                 [n], torch.arange(done + delta, last + delta, device=device))[-1:]
        for s in range(K):
            want = h[0].double()
            error = (outputs[s, b].double() - want).abs().max() / want.abs().max()
            assert error <= out_tol, (b, s, float(error), out_tol)
            # the draft is the argmax of the head over its own output, where the margin
            # exceeds what the eager head and the round's GEMV may differ by
            logits = head.logits(outputs[s, b: b + 1])[0, :V].float()[ids.cpu()]
            top2 = logits.topk(2).values
            if top2[0] - top2[1] > 2 * head_tol * logits.abs().max():
                assert drafts[b][s] == int(ids[logits.argmax()]), (b, s)
                checked += 1
            if s + 1 < K:  # the eager chain goes on from the round's own draft
                h = head(torch.tensor(drafts[b][s: s + 1], device=device), h,
                         [LayerKv(seq.cache, layer, last + s)], [1],
                         torch.tensor([last + s + delta], device=device))
        # the K/V each side stored at the real pairs' and the draft steps' positions
        slots = seq.cache._slots(done, last + K - 1)
        for is_k, mine in ((True, ours[0]), (False, ours[1])):
            want = stored_rows(storage, layer, is_k, slots)
            got = mine.index_select(0, slots).double()
            assert ((got - want).abs() <= kv_tol * want.abs().amax()).all(), (b, is_k)
    assert [len(d) for d in drafts] == [K, K] and checked >= 2
    if device.type == "cuda":  # a replay's drafts are read back once; nothing else waits
        with cuda_syncs() as syncs:
            steps.propose([r[0] for r in rows], [r[1:] for r in rows])
        assert len(syncs) == 1, syncs


def served_both_ways(family: str, config, arrange) -> None:
    """The same prompts served bf16 on CUDA by two `--spec mtp` engines, the first with
    `config(True)` and `arrange(engine, True)`, the second with `(False)`; `arrange` returns
    the calls it counts (`counting`): the same greedy output and counters, and the first
    side's counted path taken, in at most every round."""
    from .test_mtp_speculation import MtpArtifact
    from .test_speculation import _engine as engine_with, _prompts, _run

    artifact, prompts, runs = MtpArtifact(family), _prompts(120), []
    for on in (True, False):
        engine = engine_with(artifact, "mtp", max_concurrency=2, prefill_chunk=16,
                             cuda_dtype="bf16", **config(on))
        try:
            calls = arrange(engine, on)
            tokens = _run(engine, prompts, 32)
        finally:
            engine.stop()
        c = engine.speculator.counters
        runs.append((tokens, c.rounds, c.drafted, c.accepted))
        assert not on or 0 < sum(calls) <= c.rounds
    assert runs[0] == runs[1]


def counting(owner, name: str) -> list[int]:
    """`owner.name` wrapped to note the row count (its first argument's length) of each call."""
    calls, method = [], getattr(owner, name)
    setattr(owner, name, lambda seqs, *rest: calls.append(len(seqs)) or method(seqs, *rest))
    return calls


@torch.inference_mode()
def test_start_up_capture_reaches_each_given_bucket_on_a_scratch_page_given_back():
    """`MtpRound.capture_at_start(buckets)` (what `MtpDrafter.bind_step` runs with the decode
    graphs' start-up buckets) drafts every batch size of each bucket, the default the first
    alone, on scratch rows of one page that goes back; here uncaptured, the round spied."""
    model, head = _model(False, torch.device("cpu"))
    layers, heads, dim = model.kv_layout()
    pool = PagePool(4, PAGE)
    storage = KvStorage(pool, layers + 1, heads, dim, codecs_for("bf16", model.dtype),
                        model.dtype, model.device)
    steps = MtpRound(head, HybridWeights(model, model.params).head, storage, layers, 2, 3000, K,
                     500, capture=False)
    rounds = []

    def spy(batch, bucket):
        rounds.append((bucket, batch))
        return torch.zeros(batch, K, dtype=torch.long)
    steps.step.round = spy
    steps.capture_at_start((1024, 2048, 3000))
    assert rounds == [(c, b) for c in (1024, 2048, 3000) for b in (1, 2)]
    assert pool.free == pool.total
    rounds.clear()
    steps.capture_at_start()
    assert rounds == [(1024, 1), (1024, 2)] and pool.free == pool.total


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_the_engine_drafts_through_the_captured_round_on_cuda(family, device):
    """Served bf16 on CUDA, `--spec mtp` drafts through `MtpRound`, captured at load for every
    batch size; the same requests with the eager drafter (no round) draft the same tokens
    (the round's drafts are the eager head's, above), so they make the same rounds and the
    same greedy output. (A row near its end, whose pages stop short of L + k, drafts
    eagerly.)"""
    if device.type != "cuda":
        pytest.skip("the captured round needs the CUDA graph step")

    def arrange(engine, captured):
        drafter = engine.speculator.drafter
        # every batch size of each context bucket the decode graphs captured at load
        buckets = engine.runner.graphs.start_buckets
        assert drafter.round is not None and buckets
        assert set(drafter.round._graphs) == {(b, c) for b in (1, 2) for c in buckets}
        if captured:
            return counting(drafter.round, "propose")
        drafter.round = None
        return []
    served_both_ways(family, lambda captured: {}, arrange)


@pytest.mark.parametrize("moe", [False, True])
@torch.inference_mode()
def test_the_drafter_keeps_its_pairs_the_same_with_and_without_the_round(moe, device):
    """`MtpDrafter` through the round (uncaptured off CUDA) against the eager drafter, fed the
    same hiddens round after round: after a verify row that kept all drafts, one that kept
    none, and a stretch of plain decode steps longer than a round's `q` pairs (caught up
    eagerly first), each committed pair's MTP K/V in the pool is the eager one's, and the
    drafters hold the same pending hiddens."""
    from ninfer_engine.step.mtp_drafter import MtpDrafter

    model, head = _model(moe, device)
    layers, heads, dim = model.kv_layout()
    H, V = model.config["hidden_size"], 500
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, V, (40,), generator=gen).tolist()
    sides = []
    for with_round in (True, False):
        storage = KvStorage(PagePool(4, PAGE), layers + 1, heads, dim,
                            codecs_for("bf16", model.dtype), model.dtype, device)
        drafter = MtpDrafter(head, V)
        if with_round:
            drafter.round = MtpRound(head, HybridWeights(model, model.params).head, storage,
                                     drafter.layer, 1, 256, K, V, capture=device.type == "cuda")
        seq = SimpleNamespace(prompt=prompt, output=[], cached=0, cache=storage.new_cache(),
                              request=SimpleNamespace(prompt_cache=False))
        assert seq.cache.reserve(128)
        sides.append((drafter, seq))
    hiddens = torch.randn(80, H, generator=gen).to(device, BF16)
    tokens = torch.randint(0, V, (40,), generator=gen).tolist()

    def compute(seq, drafter, n):  # the target computed n more positions
        drafter.observe(seq, seq.cached, hiddens[seq.cached: seq.cached + n])
        seq.cached += n

    for drafter, seq in sides:
        compute(seq, drafter, len(prompt))
        seq.output.append(tokens[0])
    kv_tol, _, _ = _tols(model, 64)
    # kept 3 drafts + the bonus (4 pairs), kept none (1 pair), 6 plain steps (6 pairs > q)
    for kept in (None, 4, 1, 6):
        for drafter, seq in sides:
            if kept is not None:  # as many tokens kept as positions computed
                seq.output.extend(tokens[len(seq.output): len(seq.output) + kept])
                compute(seq, drafter, kept)
            assert len(drafter.propose_rows([seq], [K])[0]) == K
        (a, sa), (b, sb) = sides
        ra, rb = a._rows[id(sa)], b._rows[id(sb)]
        assert ra.done == rb.done == sa.cached and torch.equal(ra.pending, rb.pending)
        for is_k in (True, False):
            got = stored_rows(sa.cache.storage, a.layer, is_k, sa.cache._slots(0, ra.done))
            want = stored_rows(sb.cache.storage, b.layer, is_k, sb.cache._slots(0, rb.done))
            assert ((got - want).abs() <= kv_tol * want.abs().amax()).all(), (kept, is_k)


@torch.inference_mode()
def test_a_round_that_fails_leaves_the_drafter_drafting_eagerly(device, caplog):
    """A failure inside the round (here: raised by its replay) is logged once; that call and
    the later ones draft through the eager head, from the same committed pairs."""
    from ninfer_engine.step.mtp_drafter import MtpDrafter

    model, head = _model(False, device)
    layers, heads, dim = model.kv_layout()
    storage = KvStorage(PagePool(2, PAGE), layers + 1, heads, dim,
                        codecs_for("bf16", model.dtype), model.dtype, device)
    drafter = MtpDrafter(head, 500)
    drafter.round = MtpRound(head, HybridWeights(model, model.params).head, storage,
                             drafter.layer, 1, 128, K, 500, capture=False)

    def broken(seqs, pairs):
        raise RuntimeError("replay failed")
    drafter.round.propose = broken
    seq = SimpleNamespace(prompt=list(range(20)), output=[7], cached=20,
                          cache=storage.new_cache(), request=SimpleNamespace(prompt_cache=False))
    assert seq.cache.reserve(64)
    gen = torch.Generator().manual_seed(4)
    drafter.observe(seq, 0, torch.randn(20, model.config["hidden_size"], generator=gen)
                    .to(device, BF16))
    assert len(drafter.propose_rows([seq], [K])[0]) == K
    assert drafter.round is None and drafter._rows[id(seq)].done == 20
    assert "drafting eagerly" in caplog.text


@torch.inference_mode()
def test_the_eager_drafter_runs_a_media_prompts_pairs_as_the_target_ran_its_tokens():
    """A media prompt's pairs run at its MRoPE positions ([3, n]: the image's grid inside its
    span) with its image pads embedded by their encoder rows; a chunk's pairs run as it is
    computed, the one whose next token is the next chunk's first, an image pad not encoded
    yet, with the next chunk. Its draft steps run at L + s + rope delta. A prompt without
    media runs at its positions with its tokens' embeddings."""
    from ninfer_engine.step.mtp_drafter import MtpDrafter

    model, head = _model(False, torch.device("cpu"))
    layers, heads, dim = model.kv_layout()
    storage = KvStorage(PagePool(8, PAGE), layers + 1, heads, dim,
                        codecs_for("bf16", model.dtype), model.dtype, torch.device("cpu"))
    drafter, calls = MtpDrafter(head, 500), []

    class Noting:  # the head, noting each call's positions and media rows
        def __call__(self, *args):
            calls.append((args[4].clone(), args[5] if len(args) > 5 else None))
            return head(*args)

        def __getattr__(self, name):
            return getattr(head, name)
    drafter.head = Noting()
    gen, H, P = torch.Generator().manual_seed(3), model.config["hidden_size"], 40
    media, image = _media_prompt(P), torch.randn(16, H, generator=gen).to(BF16)
    seqs = [SimpleNamespace(cache=storage.new_cache(), prompt=tuple(range(5, 5 + P)),
                            output=[7], cached=P, request=SimpleNamespace(media=m),
                            media_rows={}, rope_delta=0 if m is None else m.rope_delta)
            for m in (media, None)]
    for seq in seqs:  # the prompt in chunks of 16, 16 and 8 positions
        assert seq.cache.reserve(P + K)
        hidden = torch.randn(P, H, generator=gen).to(BF16)
        for start in (0, 16, 32):
            if seq.request.media is not None and start == 16:  # its chunk encodes the image
                seq.media_rows[0] = image
            drafter.observe(seq, start, hidden[start: start + 16])
    drafts = drafter.propose_rows(seqs, [K, K])  # pairs 39 of both rows, then the drafts
    assert [len(d) for d in drafts] == [K, K]
    # the media row's chunks: pairs 0..14 (tokens 1..15: token 16, a pad, is not encoded
    # yet), 15..31 (tokens 16..32), 32..38 (tokens 33..39)
    for (positions, pads), (start, end) in zip(calls[:3], ((0, 15), (15, 32), (32, 39))):
        assert torch.equal(positions, media.positions_for(start, end - start))
        if start == 15:  # pairs 15..30: the image's pads 16..31, in order
            assert pads[0].tolist() == list(range(16)) and torch.equal(pads[1], image)
        else:
            assert pads is None
    for positions, pads in calls[3:6]:  # the text row's chunks
        assert positions.dim() == 1 and pads is None
    positions, pads = calls[6]  # pair 39 of both rows together
    both = torch.stack([media.positions_for(P - 1, 1)[:, 0], torch.full((3,), P - 1)], 1)
    assert torch.equal(positions, both) and pads is None
    for s, (positions, _) in enumerate(calls[7:]):  # past the prompt: L + s (+ the delta)
        assert positions.tolist() == [P + s - 12, P + s]
    assert len(calls) == 6 + K
