"""Misses copied into a slot or computed on the CPU: the copy path equals all-resident bit for
bit, the CPU path differs only by its own fp32 arithmetic (tiny-moe, the CPU reference)."""
from __future__ import annotations

import pytest
import torch

from ninfer_engine.artifact.synth import build_synthetic
from ninfer_engine.experts import plan_placement
from ninfer_engine.experts.tiers import ExpertTiers, expert_name
from ninfer_engine.kernels.moe_down import moe_down_combine
from ninfer_engine.kernels.moe_fused import moe_gate_up_silu
from ninfer_engine.models.packed import FP8_ROW, quantize_packed
from ninfer_engine.models.qwen3_5 import Qwen35Model
from tests.tolerance import TRANSCENDENTAL, assert_within, bound

H, I, E, K = 64, 24, 8, 2  # tiny-moe
EXPERT_BYTES = (2 * I * H + H * I) * 4


def tiered_model(miss: str, slots: int = 2):
    config, source = build_synthetic("tiny-moe", "cpu", torch.float32)
    placement = plan_placement(config, EXPERT_BYTES, slots * 4 * EXPERT_BYTES)
    tiers = ExpertTiers(config, placement,
                        lambda l, e, m, s: source(expert_name(l, e, m), s), "cpu", miss)
    model = Qwen35Model(config, tiers.placeholders(source))
    tiers.install(model)
    return Qwen35Model(config, source), model, tiers


def greedy_logits(model, prompt: list[int], steps: int) -> list[torch.Tensor]:
    state = model.new_state()
    out = [model.forward(torch.tensor(prompt), state, last_only=True)]
    for _ in range(steps):
        out.append(model.forward(out[-1].argmax(-1), state))
    return out


def test_the_copy_path_equals_every_expert_resident():
    """Two slots of eight per layer, every miss copied in: the prompt (eight experts a layer
    routed, one at a time through the slots) and 12 decode steps give the same logits bit for
    bit, with misses, hits and copies counted."""
    resident, model, tiers = tiered_model("copy")
    prompt = [11, 2000, 7, 99, 512, 3, 40000, 8]
    for a, b in zip(greedy_logits(resident, prompt, 12), greedy_logits(model, prompt, 12)):
        assert torch.equal(a, b)
    stats = [(t.map.hits, t.map.misses, t.cpu_pairs, t.bytes_copied) for t in
             tiers.layers.values()]
    assert all(hits > 0 and misses > 0 and cpu == 0 and copied == misses * EXPERT_BYTES
               for hits, misses, cpu, copied in stats)
    assert resident.weight_bytes() - model.weight_bytes() == E * 4 * EXPERT_BYTES


def test_cpu_compute_differs_by_its_own_fp32_arithmetic_only():
    """Every miss on the CPU (fp32 from the host store) against all-resident: the same routed
    experts, each side within fp32 error of the float64 SwiGLU. Per expert the chain is a
    K = 64 dot product (gate|up), SiLU (transcendental) and the product, then a K = 24 one
    (down), then the weighted sum over top-2 and the shared expert's 3 terms."""
    resident, model, tiers = tiered_model("cpu")
    moe, tier = resident.blocks[0].ffn, tiers.layers[0]
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(1))
    weights, ids = moe.route(x)
    got = model.blocks[0].ffn.routed(x, weights, ids)
    want = moe.routed(x, weights, ids)
    resident_at_start = {0, 1}  # the slots' initial fill
    on_cpu = sum(int(e) not in resident_at_start for e in ids.flatten())
    assert tier.cpu_pairs == on_cpu > 0 and tier.device_pairs == 5 * K - on_cpu
    exact = torch.zeros(5, H, dtype=torch.float64)
    for t in range(5):
        for j in range(K):
            e = int(ids[t, j])
            w = moe.experts[e]
            h = x[t].double()
            act = torch.nn.functional.silu(w.gate.double() @ h) * (w.up.double() @ h)
            exact[t] += float(weights[t, j]) * (w.down.double() @ act)
    depth = H + I + TRANSCENDENTAL + 4
    scale = exact.abs().max()
    for side in (got, want):
        assert_within(side, exact, bound(torch.float32, depth, sides=1) * scale)


@pytest.mark.parametrize("miss", ["copy", "cpu"])
def test_the_decode_kernels_read_slots_through_the_map(miss):
    """`LayerTier.decode` (what `HybridStep._moe` calls before the fused expert kernels) over
    fp8-row experts: slot ids + weights with the CPU pairs zeroed + the CPU sum give the
    all-resident kernels' output, exactly on the copy path; on the CPU path within the
    kernels' bf16 output rounding (their act is stored bf16: one rounding of u = 2⁻⁸ per
    element, then the K = 24 down dot product) plus the fp32 CPU side."""
    gen = torch.Generator().manual_seed(0)
    stored = {}

    def get(layer, e, member, shape):
        key = (layer, e, member)
        if key not in stored:
            stored[key] = quantize_packed(torch.randn(shape, generator=gen) / shape[1] ** 0.5,
                                          FP8_ROW)
        return stored[key]

    config = {"num_experts": E, "num_hidden_layers": 1, "hidden_size": H,
              "moe_intermediate_size": I}
    fp8_bytes = 2 * I * H + 2 * I * 2 + H * I + H * 2
    tiers = ExpertTiers(config, plan_placement(config, fp8_bytes, 3 * fp8_bytes), get, "cpu",
                        miss)
    tier = tiers.layers[0]
    B = 4
    y = torch.randn(B, H, generator=gen).to(torch.bfloat16)
    ids = torch.tensor([4, 5, 1, 5, 7, 2, 6, 4])  # slots hold 0, 1, 2: hits 1 and 2
    weights = torch.rand(B, K, generator=gen)
    full_gu, full_down = tiers.host.stacks[0]
    act = moe_gate_up_silu(y, full_gu.w, ids, scale=full_gu.scale)
    want = moe_down_combine(act, full_down.w, ids, weights, B, K, scale=full_down.scale)
    slots, masked, on_cpu = tier.decode(y, ids, weights, K)
    act = moe_gate_up_silu(y, tier.slot_gu.w, slots, scale=tier.slot_gu.scale)
    got = moe_down_combine(act, tier.slot_down.w, slots, masked, B, K, scale=tier.slot_down.scale)
    if on_cpu is not None:
        got = got.float() + on_cpu
    assert (tier.map.hits, tier.map.misses) == (2, 4)
    # copy: expert 0's slot is the only one no routed expert needs: one miss copied, three on
    # the CPU; cpu: all four
    copied = 1 if miss == "copy" else 0
    assert tier.bytes_copied == copied * fp8_bytes
    on_device = [e for e in ids.tolist() if tier.map.slot_of[e] >= 0]
    assert len({*on_device}) == 2 + copied and tier.device_pairs == len(on_device)
    assert tier.cpu_pairs == 8 - len(on_device)
    cpu_rows = {i // K for i, e in enumerate(ids.tolist()) if tier.map.slot_of[e] < 0}
    for b in range(B):
        if b not in cpu_rows:
            assert torch.equal(got[b].to(want.dtype), want[b])
    scale = want.float().abs().max()
    limit = (bound(torch.bfloat16, I + H, roundings=3) + 2 ** -8) * scale
    assert_within(got.float(), want.float(), limit)


def test_prefetch_copies_the_next_layers_guess_ahead():
    """With prefetch on, layer 0's decode puts layer 1's router top-k over layer 0's input
    into layer 1's slots (counted as copies, not lookups); layer 1's step then hits them."""
    from types import SimpleNamespace

    gen = torch.Generator().manual_seed(3)
    config = {"num_experts": E, "num_hidden_layers": 2, "hidden_size": H,
              "moe_intermediate_size": I}
    drawn = {}

    def get(layer, e, member, shape):
        return drawn.setdefault((layer, e, member), torch.randn(shape, generator=gen))

    tiers = ExpertTiers(config, plan_placement(config, EXPERT_BYTES, 2 * 2 * EXPERT_BYTES),
                        get, "cpu", "copy", prefetch=True)
    y = torch.randn(1, H, generator=gen)
    router = torch.zeros(E, H)
    router[6], router[7] = y[0], 0.5 * y[0]  # layer 1's top-2 for y: experts 6 and 7
    model = SimpleNamespace(blocks=[SimpleNamespace(ffn=SimpleNamespace(router=torch.eye(E, H))),
                                    SimpleNamespace(ffn=SimpleNamespace(router=router))])
    tiers.install(model)
    first, second = tiers.layers[0], tiers.layers[1]
    assert first.next is second and second.next is None
    first.decode(y, torch.tensor([0, 1]), torch.ones(1, K), K)
    assert (first.map.hits, first.map.misses) == (2, 0)
    assert sorted(second.map.held) == [6, 7] and second.prefetched == 2
    assert second.bytes_copied == 2 * EXPERT_BYTES and second.map.misses == 0
    second.decode(y, torch.tensor([7, 6]), torch.ones(1, K), K)
    assert (second.map.hits, second.map.misses) == (2, 0)


@pytest.mark.parametrize("groups", [0, 4])
def test_host_fp8_decode_equals_the_dequant_kernels_reference(groups):
    """The CPU path's table decode of fp8 members (every one of the 256 codes, row or group
    scales) gives `fp8_dequant`'s fp32 values bit for bit (NaN codes stay NaN)."""
    from ninfer_engine.experts.host_compute import _host_fp32
    from ninfer_engine.kernels.fp8_dequant import fp8_dequant_ref
    from ninfer_engine.models.packed import FP8_GROUPS, PackedBlock, PackedMatrix
    codes = torch.arange(256, dtype=torch.uint8).repeat(16).view(32, 128)
    codes = codes.view(torch.float8_e4m3fn)
    scale = torch.rand(32, groups) if groups else torch.rand(32)
    member = PackedMatrix([PackedBlock(FP8_GROUPS if groups else FP8_ROW, 32, 128,
                                       (codes, scale.to(torch.bfloat16)))])
    got = _host_fp32(member)
    want = fp8_dequant_ref(codes, scale.to(torch.bfloat16), torch.float32)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan().any()
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))
