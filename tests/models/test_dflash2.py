"""DFlash2's grouped dynamic convolution and candidate selector (`models.dflash2`) against float64
loops written from their definitions (vLLM's `qwen3_dflash2.py` and its speculator's greedy
selector walk), the convolution's reach (causal, inside its block), and the drafter's proposal
through both on a tiny target."""
from __future__ import annotations

import math

import pytest
import torch

from ninfer_engine.models.dflash2 import CandidateSelector, GroupedConv, block_positions
from tests.tolerance import gamma

F32 = torch.float32
H, TAPS, GROUP = 32, 2, 8


def _conv(seed: int = 0, taps: int = TAPS):
    gen = torch.Generator().manual_seed(seed)
    tensors = {"c/base_kernel": torch.randn(2, taps, H, generator=gen),
               "c/kernel_projection": torch.randn(2 * taps * (H // GROUP), H, generator=gen) * 0.3}
    return GroupedConv(lambda n, s: tensors[n], "c/", H, taps, GROUP), tensors


def _conv_f64(x, tensors, side, coefficients, spread, sizes, taps=TAPS):
    """(out, bound): out[t, c] = Σ_tap (base[side, tap, c] + d[t, tap, c // group]) ·
    x[t − tap, c], with x before the row's block zero, in float64; bound: the fp32 path's error
    there, each d an H-long dot (γ_H of its terms' sum `spread`), then base + d, the product
    and the sum over taps (γ_(taps + 2) of each term)."""
    base = tensors["c/base_kernel"].double()[side]
    out = torch.zeros(x.shape, dtype=torch.float64)
    bound = torch.zeros(x.shape, dtype=torch.float64)
    start = 0
    for n in sizes:
        for t in range(start, start + n):
            for tap in range(taps):
                if t - tap < start:
                    continue
                d = coefficients[t, tap].double().repeat_interleave(GROUP)
                e = spread[t, tap].double().repeat_interleave(GROUP)
                xs = x[t - tap].double()
                out[t] += (base[tap] + d) * xs
                bound[t] += xs.abs() * (gamma(F32, H) * e
                                        + gamma(F32, taps + 2) * (base[tap].abs() + d.abs()))
        start += n
    return out, bound


@pytest.mark.parametrize("taps", [2, 3])
def test_the_convolution_pair_is_its_definition_block_by_block(taps):
    conv, tensors = _conv(1, taps)
    sizes = [4, 1, 6]
    gen = torch.Generator().manual_seed(2)
    x, y = (torch.randn(sum(sizes), H, generator=gen) for _ in range(2))
    at = block_positions(sizes, x.device)
    before, after = conv.prepare(x, at)
    w = tensors["c/kernel_projection"].double()
    d = (x.double() @ w.t()).view(-1, 2, taps, H // GROUP)
    spread = (x.double().abs() @ w.abs().t()).view(d.shape)  # Σ|x_i w_i| of each coefficient
    assert ((after.double() - d[:, 1]).abs() <= gamma(F32, H) * spread[:, 1]).all()
    for got, side, z in ((before, 0, x), (conv.finish(y, after, at), 1, y)):
        want, bound = _conv_f64(z, tensors, side, d[:, side], spread[:, side], sizes, taps)
        assert ((got.double() - want).abs() <= bound).all()


def test_a_row_reads_only_itself_and_the_rows_before_it_in_its_block():
    conv, _ = _conv(3)
    sizes = [5, 5]
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(10, H, generator=gen)
    at = block_positions(sizes, x.device)
    base, _ = conv.prepare(x, at)
    for changed in (2, 5):  # a row inside the first block; the second block's first row
        moved = x.clone()
        moved[changed] += 1.0
        out, _ = conv.prepare(moved, at)
        differs = (out - base).abs().amax(-1) > 0
        block_end = 5 if changed < 5 else 10
        assert differs[changed] and not differs[:changed].any()  # nothing before it moves
        assert not differs[block_end:].any()  # nor another block
        assert differs[changed: min(changed + TAPS, block_end)].all()


def _selector(vocab=40, rank=4, top_k=5, zero=False, seed=5):
    gen = torch.Generator().manual_seed(seed)
    codebook = torch.zeros if zero else lambda s: torch.randn(s, generator=gen)
    tensors = {f"dflash2/candidate_selector/{n}": (codebook(s) if n.endswith("codebook")
                                                   else torch.randn(s, generator=gen))
               for n, s in (("hidden_projection", (rank, H)),
                            ("predecessor_codebook", (vocab, rank)),
                            ("successor_codebook", (vocab, rank)))}
    return CandidateSelector(lambda n, s: tensors[n], H, vocab, rank, top_k, 1.0, None), tensors


def test_the_greedy_walk_is_the_definitions_path():
    selector, t = _selector()
    gen = torch.Generator().manual_seed(6)
    sizes, anchors = [3, 1, 4], [7, 0, 39]
    logits = torch.randn(sum(sizes), 40, generator=gen) * 3
    hidden = torch.randn(sum(sizes), H, generator=gen)
    got, _ = selector.walk(logits, hidden, anchors, sizes)
    P, S = (t[f"dflash2/candidate_selector/{n}_codebook"].double()
            for n in ("predecessor", "successor"))
    W = t["dflash2/candidate_selector/hidden_projection"].double()
    want, row = [], 0
    for anchor, n in zip(anchors, sizes):
        previous = anchor
        for step in range(n):
            values, ids = torch.topk(logits[row + step].double(), 5)
            context = P[previous] * (W @ hidden[row + step].double())
            scores = values + S[ids] @ context
            previous = int(ids[int(scores.argmax())])
            want.append(previous)
        row += n
    assert got == want


def test_with_zero_codebooks_the_walk_takes_each_rows_argmax():
    """A selector whose codebooks add nothing drafts DFlash's drafts."""
    selector, _ = _selector(zero=True)
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(6, 40, generator=gen)
    hidden = torch.randn(6, H, generator=gen)
    assert selector.walk(logits, hidden, [1, 2], [2, 4])[0] == logits.argmax(-1).tolist()


def test_scaled_and_softcapped_unary_values_keep_the_candidates_order():
    selector, _ = _selector()
    selector.scale, selector.softcap = 0.5, 2.0
    logits = torch.tensor([[3.0, -1.0, 8.0, 0.5, 2.0, 7.0]])
    selector.top_k = 3
    ids, values = selector.candidates(logits)
    assert ids.tolist() == [[2, 5, 0]]
    want = torch.tanh(torch.tensor([8.0, 7.0, 3.0]) * 0.5 / 2.0) * 2.0
    assert torch.allclose(values[0], want)


def test_a_sampled_walk_draws_each_step_from_softmax_of_its_scores_and_keeps_it():
    """Row 0 samples at temperature 0.7 with given uniforms, row 1 walks greedily: row 0's
    picks are the inverse CDF of softmax(scores / 0.7) at its uniforms (scores as the
    definition's, after its own picks), and its proposals are those distributions."""
    selector, t = _selector()
    gen = torch.Generator().manual_seed(8)
    sizes, anchors, uniforms = [3, 2], [4, 9], [0.05, 0.5, 0.97]
    logits = torch.randn(sum(sizes), 40, generator=gen) * 2
    hidden = torch.randn(sum(sizes), H, generator=gen)
    got, proposals = selector.walk(logits, hidden, anchors, sizes, [(0.7, uniforms), None])
    P, S = (t[f"dflash2/candidate_selector/{n}_codebook"].double()
            for n in ("predecessor", "successor"))
    W = t["dflash2/candidate_selector/hidden_projection"].double()
    previous, want = anchors[0], []
    for step, u in enumerate(uniforms):
        values, ids = torch.topk(logits[step].double(), 5)
        h = hidden[step].double()
        scores = values + S[ids] @ (P[previous] * (W @ h))
        q = torch.softmax(scores / 0.7, -1)
        ids_got, q_got = proposals[0][step]
        # fp32 scores: an H-long dot, two products, a rank-long sum and the unary's add, over
        # the terms' magnitudes; softmax moves each q by at most a factor e^(2·max error / T)
        spread = (values.abs() + S[ids].abs() @ (P[previous].abs() * (W.abs() @ h.abs())))
        error = gamma(F32, H + 4 + 3) * float(spread.max())
        assert torch.equal(ids_got, ids)
        assert ((q_got - q).abs() <= q * math.expm1(2 * error / 0.7)).all()
        previous = int(ids[int((q.cumsum(0) <= u * q.sum()).sum())])
        want.append(previous)
    assert got[:3] == want and proposals[1] is None
    greedy, none = selector.walk(logits, hidden, anchors, sizes)
    assert greedy[3:] == got[3:] and none == [None, None]
