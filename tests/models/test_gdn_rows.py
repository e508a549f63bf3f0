"""`GatedDeltaNet` over a step's rows: the conv of every row in one pass (`_conv_rows`) gives
each row the outputs and the conv state of `_conv` on that row alone, bit for bit (every output
is the same products summed in the same order), whatever the rows' lengths."""
from __future__ import annotations

import copy

import pytest
import torch

from ninfer_engine.models.gdn import GatedDeltaNet

CONFIG = {"hidden_size": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
          "linear_key_head_dim": 8, "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4,
          "rms_norm_eps": 1e-6}


def _layer(seed: int, dtype: torch.dtype = torch.float32) -> GatedDeltaNet:
    gen = torch.Generator().manual_seed(seed)
    return GatedDeltaNet(CONFIG, lambda name, shape: (torch.randn(shape, generator=gen)
                                                      * 0.3).to(dtype), "layers/0/")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [[1, 5, 3], [7], [1, 1, 1, 1], [2, 64, 1]])
def test_the_conv_of_all_rows_equals_each_row_alone(dtype, lengths):
    layer = _layer(3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(sum(lengths), layer.conv_dim, generator=gen).to(dtype)
    states = [layer.new_state(dtype, torch.device("cpu")) for _ in lengths]
    for state in states:  # a row continuing an earlier chunk: its window holds real rows
        state.conv.copy_(torch.randn(state.conv.shape, generator=gen).to(dtype))
    alone = copy.deepcopy(states)
    want, start = [], 0
    for state, n in zip(alone, lengths):
        want.append(layer._conv(x[start: start + n], state))
        start += n
    got = layer._conv_rows(x, states, lengths)
    assert torch.equal(got, torch.cat(want))
    for state, single in zip(states, alone):
        assert torch.equal(state.conv, single.conv)


def _row_by_row(q, k, v, g, beta, states, lengths, tf32=False):
    """`chunk_gated_delta_rows` as one `chunk_gated_delta` a row (its kernel test's reference)."""
    from ninfer_engine.kernels.gdn_chunk import chunk_gated_delta

    outs, finals, start = [], [], 0
    for i, n in enumerate(lengths):
        rows = slice(start, start + n)
        o, s = chunk_gated_delta(q[rows], k[rows], v[rows], g[rows], beta[rows], states[i],
                                 tf32=tf32)
        outs.append(o)
        finals.append(s)
        start += n
    return torch.cat(outs), torch.stack(finals)


def test_a_steps_prompt_chunks_take_one_walk_with_each_rows_state(monkeypatch):
    """The layer's CUDA branch for several prompt chunks (run on the CPU through the Triton
    interpreter): stacking the rows' states, the one walk and the copies back give the layer
    output and states of one walk a row."""
    from ninfer_engine.kernels import _dispatch, gdn_chunk
    from ninfer_engine.models import gdn

    if not (_dispatch.HAVE_TRITON and _dispatch.interpreting()):
        pytest.skip("needs Triton's interpreter")
    monkeypatch.setattr(gdn, "use_triton", lambda tensor: True)
    layer = _layer(5, torch.bfloat16)
    lengths = [3, 40, 17]
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(sum(lengths), CONFIG["hidden_size"], generator=gen).bfloat16()
    states = [layer.new_state(torch.bfloat16, torch.device("cpu")) for _ in lengths]
    for state in states:
        state.ssm.copy_(torch.randn(state.ssm.shape, generator=gen))
    alone = copy.deepcopy(states)
    calls = []
    batched = gdn_chunk.chunk_gated_delta_rows
    monkeypatch.setattr(gdn_chunk, "chunk_gated_delta_rows",
                        lambda *a, **kw: calls.append(1) or batched(*a, **kw))
    got = layer(x, states, lengths)
    monkeypatch.setattr(gdn_chunk, "chunk_gated_delta_rows", _row_by_row)
    want = layer(x, alone, lengths)
    assert calls == [1]
    assert torch.equal(got, want)
    for state, single in zip(states, alone):
        assert torch.equal(state.ssm, single.ssm) and torch.equal(state.conv, single.conv)
