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


def test_a_steps_prompt_chunks_run_as_each_row_alone(monkeypatch):
    """The layer's CUDA branch for a step's prompt chunks (run on the CPU through the Triton
    interpreter: the fused prologue, one walk over every row, the gated norm): each row's output
    and its conv and recurrent states are those of the same kernels run on that row alone."""
    from ninfer_engine.kernels import _dispatch, gdn_chunk, gdn_fused, gdn_prompt
    from ninfer_engine.models import gdn

    if not (_dispatch.HAVE_TRITON and _dispatch.interpreting()):
        pytest.skip("needs Triton's interpreter")
    for module in (gdn, gdn_prompt, gdn_fused):
        monkeypatch.setattr(module, "use_triton", lambda tensor: True)
    layer = _layer(5, torch.bfloat16)
    lengths = [3, 40, 17, 2]  # the 2- and 3-token rows read their old conv state
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(sum(lengths), CONFIG["hidden_size"], generator=gen).bfloat16()
    states = [layer.new_state(torch.bfloat16, torch.device("cpu")) for _ in lengths]
    for state in states:  # rows continuing earlier chunks
        state.ssm.copy_(torch.randn(state.ssm.shape, generator=gen))
        state.conv.copy_(torch.randn(state.conv.shape, generator=gen).bfloat16())
    alone = copy.deepcopy(states)
    got = layer(x, states, lengths)

    qkv = torch.cat([proj(x) for proj in (layer.q, layer.k, layer.v)], -1)
    z, b, a = layer.z(x), layer.b(x), layer.a(x)
    outs, start = [], 0
    for state, n in zip(alone, lengths):
        rows = slice(start, start + n)
        lay = gdn_prompt.prompt_layout((n,), x.device)
        q, k, v, g, beta, conv = gdn_prompt.gdn_prompt_prep(
            qkv[rows], b[rows], a[rows], state.conv[None], layer.conv, layer.a_log,
            layer.dt_bias, layer.nk, layer.dk, lay)
        o, ssm = gdn_chunk.chunk_gated_delta_padded(q, k, v, g, beta, state.ssm[None],
                                                    lay.first, tf32=True,
                                                    tiles_dtype=torch.bfloat16)
        state.conv.copy_(conv[0])
        state.ssm.copy_(ssm[0])
        outs.append(o[:n])
        start += n
    want = layer.out(gdn_fused.gdn_gated_norm(torch.cat(outs), z, layer.norm, layer.eps))
    assert torch.equal(got, want)
    for state, single in zip(states, alone):
        assert torch.equal(state.ssm, single.ssm) and torch.equal(state.conv, single.conv)
