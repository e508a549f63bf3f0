"""Tensor formats: sizes, bit-exact layouts and reference-encoder round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer_engine.codecs import encodings
from ninfer_engine.artifact.errors import ArtifactError

ROW_SPLIT = {
    "q4_g64_fp16": (4, 64),
    "q5_g64_fp16": (5, 64),
    "q6_g64_fp16": (6, 64),
    "q8_g32_fp16": (8, 32),
}


@pytest.mark.parametrize(
    ("fmt", "shape", "size"),
    [
        ("q4_g64_fp16", [7168, 5120], 19_496_960),
        ("q5_g64_fp16", [7168, 5120], 24_084_480),
        ("q5_g64_fp16", [2, 130], 528),
        ("bf16", [3, 5], 30),
        ("fp32", [], 4),
        ("int32", [7], 28),
    ],
)
def test_spec_sizes(fmt, shape, size):
    assert encodings.encoded_size(fmt, shape) == size


@pytest.mark.parametrize("fmt", sorted(ROW_SPLIT))
def test_row_split_round_trip_within_half_a_step(fmt):
    bits, group = ROW_SPLIT[fmt]
    torch.manual_seed(0)
    x = torch.randn(33, 300) * torch.logspace(-3, 2, 33).unsqueeze(1)
    data = encodings.encode(fmt, x)
    assert len(data) == encodings.encoded_size(fmt, x.shape)
    y = encodings.decode(fmt, data, x.shape)
    padded = torch.nn.functional.pad(x, (0, 384 - 300)).view(33, -1, group)
    step = (padded.abs().amax(-1) / (2 ** (bits - 1) - 1)).repeat_interleave(group, 1)[:, :300]
    assert y.shape == x.shape and y.dtype == torch.float32
    assert bool(((y - x).abs() <= step * 0.5 * 1.01 + 1e-7).all())


@pytest.mark.parametrize(
    ("fmt", "dtype", "tol"), [("bf16", torch.float32, 2**-8), ("fp32", torch.float32, 0.0)]
)
def test_contiguous_float_round_trip(fmt, dtype, tol):
    x = torch.randn(4, 3, 5, dtype=dtype)
    y = encodings.decode(fmt, encodings.encode(fmt, x), [4, 3, 5])
    assert torch.allclose(y, x, rtol=tol, atol=0)


def test_int32_round_trip_is_exact_and_stays_int32():
    x = torch.tensor([0, -1, 2**31 - 1, 248077, -(2**31)], dtype=torch.int32)
    y = encodings.decode("int32", encodings.encode("int32", x), [5])
    assert y.dtype == torch.int32 and torch.equal(x, y)


def _pack_reference(codes: list[int], bits: int, scale: float) -> bytes:
    """An independent, loop-based packer for one [1, 64] tensor written from §2.1."""
    group = 64 if bits < 8 else 32
    groups = 128 // group
    unsigned = [c % (1 << bits) for c in codes] + [0] * (128 - len(codes))
    base = bytearray(groups * 32)
    if bits == 8:
        base[: len(codes)] = bytes(unsigned[: len(codes)])
    else:
        for j in range(64):
            base[j] = (unsigned[2 * j] & 0xF) | ((unsigned[2 * j + 1] & 0xF) << 4)
    high_per_group = {4: 0, 5: 8, 6: 16, 8: 0}[bits]
    high = bytearray(groups * high_per_group)
    for i in range(64 if high_per_group else 0):
        if bits == 5:
            high[i // 8] |= ((unsigned[i] >> 4) & 1) << (i % 8)
        else:
            high[i // 4] |= ((unsigned[i] >> 4) & 3) << (2 * (i % 4))
    scales = np.zeros(groups, dtype="<f2")
    scales[0] = scale
    if bits == 8:
        scales[1] = scale
    out = bytes(base).ljust(256, b"\0")
    if high_per_group:
        out += bytes(high).ljust(256, b"\0")
    return out + scales.tobytes()


@pytest.mark.parametrize("fmt", sorted(ROW_SPLIT))
def test_hand_built_bit_patterns_decode_and_encode_exactly(fmt):
    bits, _ = ROW_SPLIT[fmt]
    qmax = 2 ** (bits - 1) - 1
    qmin = -qmax if bits == 8 else -qmax - 1
    rng = np.random.default_rng(bits)
    codes = [int(c) for c in rng.integers(qmin, qmax + 1, 64)]
    codes[5], codes[40] = qmax, qmin  # every group holds +qmax, so amax/qmax is exactly the scale
    if bits == 8:
        codes[37] = qmax
    data = _pack_reference(codes, bits, 0.5)
    assert len(data) == encodings.encoded_size(fmt, [1, 64])
    expected = torch.tensor(codes, dtype=torch.float32).view(1, 64) * 0.5
    assert torch.equal(encodings.decode(fmt, data, [1, 64]), expected)
    symmetric = [max(c, -qmax) for c in codes]  # the encoder's codes stay within ±qmax
    values = torch.tensor(symmetric, dtype=torch.float32).view(1, 64) * 0.5
    assert encodings.encode(fmt, values) == _pack_reference(symmetric, bits, 0.5)


def test_q5_single_high_bit_lands_on_its_lane():
    data = bytearray(encodings.encoded_size("q5_g64_fp16", [1, 64]))
    data[256 + 2] = 0b0000_1000  # stream bit 19: lane 19's bit 4 → u = 16 → q = -16
    data[512:514] = np.float16(1.0).tobytes()
    values = encodings.decode("q5_g64_fp16", bytes(data), [1, 64])[0]
    assert values[19] == -16 and int((values != 0).sum()) == 1


def test_q6_single_high_bits_land_on_their_lane():
    data = bytearray(encodings.encoded_size("q6_g64_fp16", [1, 64]))
    data[5] = 0x30  # lane 11 (high nibble of byte 5) low bits = 3
    data[256 + 2] = 0b1000_0000  # byte 11//4 = 2, bits 6 and 7 are lane 11's bits 4 and 5
    data[512:514] = np.float16(2.0).tobytes()
    values = encodings.decode("q6_g64_fp16", bytes(data), [1, 64])[0]
    assert values[11] == 2.0 * (3 + 32 - 64) and int((values != 0).sum()) == 1


def test_grouped_absmax_scale_rules():
    tiny = torch.zeros(1, 64)
    tiny[0, 3] = 1e-9  # amax/qmax rounds to fp16 zero → the smallest subnormal 0x0001
    data = encodings.encode("q8_g32_fp16", tiny)
    assert np.frombuffer(data[-8:-6], "<u2")[0] == 1
    ones = torch.full((1, 32), -1.0)
    data = encodings.encode("q8_g32_fp16", ones)
    assert data[0] == 0x81  # -127, never -128
    zero = encodings.encode("q4_g64_fp16", torch.zeros(2, 64))
    assert not any(zero)


def test_row_range_decode_matches_full_decode():
    x = torch.randn(20, 130)
    for fmt in [*ROW_SPLIT, "bf16", "fp32"]:
        data = encodings.encode(fmt, x)
        full = encodings.decode(fmt, data, [20, 130])
        assert torch.equal(encodings.decode(fmt, data, [20, 130], rows=(7, 11)), full[7:11])


@pytest.mark.parametrize(
    ("fmt", "needle"),
    [
        ("q3_g64_fp16", 'unknown format "q3_g64_fp16"'),
        ("t2_g128_fp16", "t2_g128_fp16"),
        ("fp8_e4m3fn", "fp8_e4m3fn"),
        ("expert_block_scale_k16_m128x4_v1", "expert_block_scale"),
    ],
)
def test_unknown_and_fork_only_formats_are_refused_by_name(fmt, needle):
    with pytest.raises(ArtifactError, match=needle):
        encodings.encoded_size(fmt, [128, 128])


def test_decode_rejects_wrong_buffer_length_and_rank():
    with pytest.raises(ArtifactError, match="needs 528 bytes"):
        encodings.decode("q5_g64_fp16", bytes(527), [2, 130])
    with pytest.raises(ArtifactError, match="rank-2"):
        encodings.encoded_size("q8_g32_fp16", [4, 4, 4])
