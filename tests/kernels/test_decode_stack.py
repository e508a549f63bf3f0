"""The whole kernel decode step (`StepHarness`) against the reference model at tiny shapes.

tiny-dense has head dims 16 (GDN) and 32 (attention), partial rotary dim 8 and an MLP width of
96: the small sizes the per-kernel tests can miss. tiny-moe is left out on purpose: its router
is near-uniform, so bf16 noise can flip a top-k choice and the comparison is not meaningful.
"""

import torch

from ninfer_engine.artifact.synth import build_synthetic
from tests.hybrid_step_harness import StepHarness
from ninfer_engine.models.fused import FusedParams
from ninfer_engine.models.qwen3_5 import Qwen35Model

from tests.tolerance import bound, cast_roundings

from .conftest import rel_err

# bf16 stores along the step, per side: a GDN layer's norm, in-projection, gated norm, output
# projection, residual, norm, gate/up, SiLU and product, down and residual (11); the attention
# layer's about 20 (the q/k norm and RoPE, the K/V store, the dot operands K, V and P, the
# output gate); the final norm and head: ~55, taken as 60, `cast_roundings()` each (2 where the
# interpreter truncates). The worst case (≈ 0.94 interpreted) cannot tell a broken kernel
# (rel_err ~1) from noise, so this uses the probabilistic bound λ·√n·u per side (Higham & Mary
# 2019; λ = 6): ≈ 0.36 on a GPU, 0.51 interpreted, which still separates the two.
TOL = bound(torch.bfloat16, 0, roundings=60 * cast_roundings(), probabilistic=6)


def test_kernel_decoder_matches_reference_on_tiny_dense(device):
    # bf16 only: the fp8 head GEMV over the real vocabulary takes minutes in the interpreter
    torch.manual_seed(0)  # the decoder's shuffled page table
    config, source = build_synthetic("tiny-dense", device, torch.bfloat16)
    params = FusedParams(config, source)
    model = Qwen35Model(config, params)
    state = model.new_state()
    prompt = torch.randint(0, 1000, (70,), generator=torch.Generator().manual_seed(1))
    model.forward(prompt.to(device), state)  # 70 tokens: the KV spans two pages
    dec = StepHarness(model, params, 192)
    dec.load_state(state)
    tok = torch.tensor([1234], device=device)
    for _ in range(2):  # the second step reads the GDN state and KV the first one wrote
        ref = model.forward(tok, state, last_only=True)
        dec.token.copy_(tok)
        out = dec.step(dec.token)
        assert rel_err(out, ref) < TOL  # a broken kernel gives ~1
        tok = ref.argmax(-1)
