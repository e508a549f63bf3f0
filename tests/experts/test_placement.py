"""Placement from a budget, the host store's one allocation, and the RAM guard (issue 20)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ninfer_engine.artifact.synth import build_synthetic, synth_config, write_synthetic
from ninfer_engine.experts import RamGuardError, check_ram_guard, plan_placement
from ninfer_engine.experts.placement import moe_layers
from ninfer_engine.experts.tiers import ExpertTiers, expert_name
from ninfer_engine.models.packed import FP8_ROW, quantize_packed

# tiny-moe on the CPU reference: one expert is gate|up [48, 64] + down [64, 24] in fp32
EXPERT_BYTES = (48 * 64 + 64 * 24) * 4


def test_the_budget_sets_the_slots_of_every_moe_layer():
    config = synth_config("tiny-moe")
    layers = moe_layers(config)
    assert layers == (0, 1, 2, 3)
    assert not plan_placement(config, EXPERT_BYTES, None).offloaded  # no budget: all resident
    assert not plan_placement(config, EXPERT_BYTES, 8 * 4 * EXPERT_BYTES).offloaded
    p = plan_placement(config, EXPERT_BYTES, 3 * 4 * EXPERT_BYTES + 4 * EXPERT_BYTES - 1)
    assert (p.slots, p.offloaded, p.host_share) == (3, True, 1 - 3 / 8)
    assert p.device_bytes == 3 * 4 * EXPERT_BYTES
    assert p.host_bytes == 8 * 4 * EXPERT_BYTES  # every expert of the offloaded layers
    with pytest.raises(ValueError, match="holds no expert slot"):
        plan_placement(config, EXPERT_BYTES, 4 * EXPERT_BYTES - 1)
    mixed = {**config, "mlp_only_layers": [1]}
    assert moe_layers(mixed) == (0, 2, 3)


def test_the_host_store_is_one_allocation_in_the_serving_form():
    """fp8-row experts stay e4m3 codes + bf16 row scales in the host store; every layer's
    stacks are views of one buffer, and a slot holds the same bytes."""
    config, source = build_synthetic("tiny-moe", "cpu", torch.float32)
    packed = {}

    def get(layer, e, member, shape):
        name = expert_name(layer, e, member)
        if name not in packed:
            packed[name] = quantize_packed(source(name, shape), FP8_ROW)
        return packed[name]

    bytes_fp8 = 48 * 64 + 48 * 2 + 64 * 24 + 64 * 2  # codes + bf16 row scales
    placement = plan_placement(config, bytes_fp8, 2 * 4 * bytes_fp8)
    tiers = ExpertTiers(config, placement, get, "cpu", miss="copy")
    host = tiers.host
    assert host.expert_bytes == bytes_fp8
    base = host.buffer.data_ptr()
    for gate_up, down in host.stacks.values():
        assert gate_up.fmt == down.fmt == FP8_ROW
        for plane in (gate_up.w, gate_up.scale, down.w, down.scale):
            start = plane.data_ptr() - base
            assert 0 <= start and start + plane.nbytes <= host.nbytes and start % 64 == 0
    gate_up, _ = host.stacks[2]
    codes, scale = get(2, 5, "up", (24, 64)).blocks[0].planes
    assert torch.equal(gate_up.w[5, 24:].view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(gate_up.scale[5, 24:], scale)
    tier = tiers.layers[2]
    assert torch.equal(tier.slot_gu.w[1].view(torch.uint8), gate_up.w[1].view(torch.uint8))


def test_the_ram_guard_refuses_with_one_line_unless_disabled():
    check_ram_guard(10 * 2**30, {}, available=11 * 2**30)
    with pytest.raises(RamGuardError) as err:
        check_ram_guard(10 * 2**30, {}, available=4 * 2**30)
    message = str(err.value)
    assert "\n" not in message
    assert "10.00 GiB of page-locked host RAM" in message and "4.00 GiB is free" in message
    assert "NINFER_RAM_GUARD=0" in message
    check_ram_guard(10 * 2**30, {"NINFER_RAM_GUARD": "0"}, available=4 * 2**30)
    check_ram_guard(0, {}, available=0)  # nothing offloaded: nothing to check


def test_the_engine_refuses_to_load_before_filling_the_host_store(monkeypatch):
    """The engine's load with free RAM reported below the host store: `EngineLoadError` with
    the guard's line (the CLI prints it and exits 1: the slow test below); with
    NINFER_RAM_GUARD=0 the same engine loads."""
    from pathlib import Path

    from ninfer_engine.config import EngineConfig
    from ninfer_engine.engine import Engine, EngineLoadError
    from ninfer_engine.experts import placement
    from tests.engine.hybrid_helpers import HybridArtifact

    artifact = HybridArtifact("qwen3_5_moe")
    config = EngineConfig(artifact=Path("tiny.ninfer"), max_context=256, cuda_dtype="fp32",
                          expert_vram_mib=2 * 4 * EXPERT_BYTES / 2**20)  # fp32 as counted
    real = placement.psutil.virtual_memory
    monkeypatch.setattr(placement.psutil, "virtual_memory",
                        lambda: SimpleNamespace(**{**real()._asdict(), "available": 4096}))
    monkeypatch.delenv("NINFER_RAM_GUARD", raising=False)
    with pytest.raises(EngineLoadError, match="page-locked host RAM but only 0.00 GiB is free"):
        Engine(config, artifact)
    monkeypatch.setenv("NINFER_RAM_GUARD", "0")
    engine = Engine(config, artifact)
    assert engine.model.expert_tiers.host.nbytes == 8 * 4 * EXPERT_BYTES


@pytest.mark.slow
def test_ninfer_serve_exits_1_when_the_experts_do_not_fit_in_free_ram(tmp_path, monkeypatch,
                                                                       capfd):
    """The real startup path (`ninfer_tui.cli.main`, headless) with free RAM reported below
    the tiny model's host store: one line naming the guard, exit 1 (slow: writing the
    synthetic artifact draws its 248K-token embedding, ~5-12 s here)."""
    from ninfer_engine.experts import placement
    from ninfer_tui.cli import main

    path = write_synthetic("tiny-moe", tmp_path / "moe.ninfer")
    monkeypatch.setattr(placement.psutil, "virtual_memory",
                        lambda: SimpleNamespace(available=4096))
    monkeypatch.delenv("NINFER_RAM_GUARD", raising=False)
    argv = [str(path), "--no-tui", "--max-context", "256", "--expert-vram-mib", "0.1",
            "--port", "1", "--log-stats-interval-ms", "0"]
    assert main(argv) == 1
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "page-locked host RAM" in line]
    assert len(lines) == 1 and "NINFER_RAM_GUARD=0" in lines[0]


def test_an_expert_budget_for_a_dense_model_is_an_error():
    from ninfer_engine.config import EngineConfig
    from ninfer_engine.experts import offloading

    config = EngineConfig(artifact=None, expert_vram_mib=512.0)
    with pytest.raises(ValueError, match="Qwen3_5ForCausalLM has no routed experts"):
        offloading(config, synth_config("tiny-dense"))
    assert offloading(config, synth_config("tiny-moe"))
    assert not offloading(EngineConfig(artifact=None), synth_config("tiny-moe"))


def test_the_expert_flags_parse_and_need_a_budget():
    from ninfer_engine.cli.flag_values import UsageError
    from ninfer_engine.cli.flags import parse_args

    c = parse_args(["m.ninfer", "--expert-vram-mib", "auto", "--expert-miss", "copy",
                    "--expert-cache", "lru", "--expert-prefetch"]).config
    assert (c.expert_vram_mib, c.expert_vram_auto, c.expert_miss, c.expert_cache,
            c.expert_prefetch) == (None, True, "copy", "lru", True)
    assert parse_args(["m.ninfer", "--expert-vram-mib", "1536.5"]).config.expert_vram_mib == 1536.5
    c = parse_args(["m.ninfer", "--expert-vram-mib", "64", "--expert-cpu-share", "0.3"]).config
    assert c.expert_cpu_share == 0.3
    c = parse_args(["m.ninfer", "--expert-vram-mib", "64", "--expert-cpu-share", "auto"]).config
    assert c.expert_cpu_share == "auto"
    assert parse_args(["m.ninfer", "--expert-vram-mib", "64"]).config.expert_cpu_share is None
    for argv, reason in ((["--expert-miss", "cpu"], "--expert-miss requires --expert-vram-mib"),
                         (["--expert-vram-mib", "-1"], "out of range"),
                         (["--expert-cache", "arc", "--expert-vram-mib", "1"], "not one of"),
                         (["--expert-cpu-share", "0.5"], "requires --expert-vram-mib"),
                         (["--expert-cpu-share", "0", "--expert-vram-mib", "1"], "out of range"),
                         (["--expert-cpu-share", "1.5", "--expert-vram-mib", "1"], "out of range"),
                         (["--expert-cpu-share", "0.5", "--expert-vram-mib", "1",
                           "--expert-miss", "copy"], "captured step")):
        with pytest.raises(UsageError, match=reason):
            parse_args(["m.ninfer", *argv])
