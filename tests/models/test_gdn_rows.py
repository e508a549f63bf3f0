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


def _layer(seed: int) -> GatedDeltaNet:
    gen = torch.Generator().manual_seed(seed)
    return GatedDeltaNet(CONFIG, lambda name, shape: torch.randn(shape, generator=gen) * 0.3,
                         "layers/0/")


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
