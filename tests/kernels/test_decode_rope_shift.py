"""The kernel decode step's rotary shift (a media prompt's rope delta, `HybridStep.shift`):
a decode token's key is rotated at index + delta but stored at its index, and its logits are
the reference model's with the shifted position."""

import copy

import torch

from ninfer_engine.artifact.synth import build_synthetic
from ninfer_engine.kernels.paged_attention import PAGE
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests.hybrid_step_harness import StepHarness
from tests.tolerance import bound, cast_roundings

from .conftest import rel_err
from .test_decode_stack import TOL

DELTA = -37  # a media prompt moves the text after it back by (pads − grid side) per item
# the first attention layer's stored key is 37 bf16 stores deep on each side: three GDN layers
# of 11 (test_decode_stack's count) and its input norm, projection, k norm and rotary. That worst
# case (0.34 on a GPU, 0.70 interpreted) does not separate the two rotations (0.54 apart), so
# each key must also be nearer its own rotation's reference than the other's.
KEY_TOL = bound(torch.bfloat16, 64, roundings=37 * cast_roundings())


def _stored_key(dec, model, index):
    """The first attention layer's key at `index` as the step stored it: [nkv, rotary dims]."""
    m = model.blocks[model.attention_layers[0]].mixer
    slot = dec.core.table[0][index // PAGE] * PAGE + index % PAGE
    return dec.kv[0].k.view(-1, m.nkv, m.d)[slot, :, : m.rope.rd]


def test_decode_rows_rotate_at_their_shifted_positions(device):
    torch.manual_seed(0)
    config, source = build_synthetic("tiny-dense", device, torch.bfloat16)
    params = FusedParams(config, source)
    model = Qwen35Model(config, params)
    state = model.new_state()
    prompt = torch.randint(0, 1000, (70,), generator=torch.Generator().manual_seed(1))
    model.forward(prompt.to(device), state)
    tok, index = torch.tensor([1234], device=device), state.seen
    refs = {}
    for shift in (DELTA, 0):
        ref_state = copy.deepcopy(state)
        logits = model.forward(tok, ref_state, last_only=True,
                               positions=torch.tensor([index + shift], device=device))
        first = model.attention_layers[0]
        refs[shift] = logits, ref_state.layers[first].k[:, -1, : model.blocks[first].mixer.rope.rd]
    ref, ref_key = refs[DELTA]
    for shift in (DELTA, 0):
        dec = StepHarness(model, params, 192)
        dec.load_state(state)
        dec.core.shift[0] = shift
        dec.token.copy_(tok)
        logits = dec.step(dec.token)
        key = _stored_key(dec, model, index)
        other = 0 if shift else DELTA
        assert rel_err(key, refs[shift][1]) < rel_err(key, refs[other][1])
        if shift:  # stored at the index, rotated at index + delta: the reference's key
            assert rel_err(key, ref_key) < KEY_TOL and rel_err(logits, ref) < TOL
