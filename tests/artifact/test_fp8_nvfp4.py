"""`fp8_e4m3fn_row_bf16` (row_scale_v1) and `nvfp4` (block_scale_k16_m128x4_v1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ninfer_engine.codecs import encodings
from ninfer_engine.codecs.blockscale import e2m1_codes
from ninfer_engine.artifact.errors import ArtifactError

E2M1_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_spec_sizes():
    assert encodings.encoded_size("nvfp4", [14336, 5120]) == 41_287_684
    assert encodings.encoded_size("fp8_e4m3fn_row_bf16", [14336, 5120]) == 73_428_992


def test_nvfp4_shape_constraints():
    with pytest.raises(ArtifactError, match="N % 128"):
        encodings.encoded_size("nvfp4", [100, 64])


def _swizzled_offset(n: int, g: int, k: int) -> int:
    """§2.2's byte offset of the scale of row ``n``, group ``g``."""
    return (
        ((n // 128) * (k // 64) + g // 4) * 512
        + ((n % 128) % 32) * 16
        + ((n % 128) // 32) * 4
        + g % 4
    )


def _nvfp4_payload(codes: np.ndarray, scales: np.ndarray, divisor: float) -> bytes:
    """A loop-built payload from natural codes [N, K] and scale bytes [N, K/16]."""
    n, k = codes.shape
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    stored = np.zeros(n * k // 16, dtype=np.uint8)
    for row in range(n):
        for group in range(k // 16):
            stored[_swizzled_offset(row, group, k)] = scales[row, group]
    start = -(-(n * k // 2) // 256) * 256
    return packed.tobytes().ljust(start, b"\0") + stored.tobytes() + np.float32(divisor).tobytes()


def test_nvfp4_single_scale_lands_where_the_swizzle_formula_says():
    n, k = 256, 128
    data = bytearray(encodings.encoded_size("nvfp4", [n, k]))
    data[: n * k // 2] = b"\x22" * (n * k // 2)  # every code is 1.0
    data[n * k // 2 + _swizzled_offset(150, 6, k)] = 0x38  # E4M3FN 1.0 for row 150, group 6
    data[-4:] = np.float32(0.5).tobytes()
    values = encodings.decode("nvfp4", bytes(data), [n, k])
    expected = torch.zeros(n, k)
    expected[150, 96:112] = 2.0
    assert torch.equal(values, expected)
    assert torch.equal(
        encodings.decode("nvfp4", bytes(data), [n, k], rows=(140, 160)), expected[140:160]
    )


def test_nvfp4_exact_values_encode_to_the_hand_built_bytes():
    n, k = 256, 128
    rng = np.random.default_rng(3)
    codes = rng.integers(0, 16, (n, k)).astype(np.uint8)
    codes[:, ::16] = 7  # every block holds +6, so the block max is 6 * scale / d_w
    scales = rng.choice(np.array([0x30, 0x38, 0x40, 0x44, 0x4E], dtype=np.uint8), (n, k // 16))
    scales[37, 3] = 0x7E  # 448: the tensor max, so d_w = 6 * 448 / max|W| is exactly 2
    data = _nvfp4_payload(codes, scales, 2.0)
    scale_values = (
        torch.from_numpy(scales).view(torch.float8_e4m3fn).float().repeat_interleave(16, 1)
    )
    signs = torch.where(torch.from_numpy(codes >= 8), -1.0, 1.0)
    expected = (
        signs * torch.tensor(E2M1_VALUES)[torch.from_numpy(codes % 8).long()] * scale_values / 2.0
    )
    assert torch.equal(encodings.decode("nvfp4", data, [n, k]), expected)
    assert encodings.encode("nvfp4", expected) == data  # code 8 round-trips as -0.0


def test_e2m1_rounds_to_nearest_even():
    values = torch.tensor(
        [0.24, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 9.0, -0.75, -6.0]
    )
    assert e2m1_codes(values).tolist() == [0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 10, 15]
    assert e2m1_codes(torch.tensor([-0.0, -0.1])).tolist() == [8, 8]


def test_nvfp4_round_trip_error():
    torch.manual_seed(0)
    x = torch.randn(128, 256)
    y = encodings.decode("nvfp4", encodings.encode("nvfp4", x), x.shape)
    block_max = x.view(128, 16, 16).abs().amax(-1).repeat_interleave(16, 1)
    assert bool(
        ((y - x).abs() <= block_max / 6 * 1.07 + 1e-6).all()
    )  # half the widest E2M1 step (4→6) plus scale rounding
    assert float((y - x).norm() / x.norm()) < 0.12


def test_fp8_row_hand_built_bytes():
    data = bytearray(encodings.encoded_size("fp8_e4m3fn_row_bf16", [2, 3]))
    data[0:6] = bytes([0x38, 0xC0, 0x01, 0x00, 0x40, 0xB8])  # 1, -2, 2^-9 | 0, 2, -1
    data[256:260] = (
        torch.tensor([0.5, 4.0], dtype=torch.bfloat16).view(torch.uint8).numpy().tobytes()
    )
    values = encodings.decode("fp8_e4m3fn_row_bf16", bytes(data), [2, 3])
    assert values.tolist() == [[0.5, -1.0, 2**-10], [0.0, 8.0, -4.0]]
    data[4] = 0x7F
    with pytest.raises(ArtifactError, match="NaN"):
        encodings.decode("fp8_e4m3fn_row_bf16", bytes(data), [2, 3])


def test_fp8_row_round_trip_error():
    torch.manual_seed(1)
    x = torch.randn(33, 100) * torch.logspace(-2, 2, 33).unsqueeze(1)
    data = encodings.encode("fp8_e4m3fn_row_bf16", x)
    y = encodings.decode("fp8_e4m3fn_row_bf16", data, x.shape)
    row_step = x.abs().amax(1, keepdim=True) / 448 * 2**-9  # E4M3FN subnormal spacing in row units
    assert bool(((y - x).abs() <= x.abs() * (2**-4 + 2**-8) * 1.01 + row_step * 1.01).all())
    assert torch.equal(encodings.decode("fp8_e4m3fn_row_bf16", data, x.shape, rows=(5, 9)), y[5:9])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp8_row_encodes_the_same_bytes_on_the_gpu():
    """`synth --device cuda` encodes where the weights are drawn: the bytes must not depend on it
    (ties, subnormals, a zero row, saturation at 448 included)."""
    torch.manual_seed(2)
    x = torch.randn(64, 300) * torch.logspace(-6, 3, 64).unsqueeze(1)
    x[3] = 0.0
    x[5, :4] = torch.tensor([448.0, -448.0, 2**-9, -(2**-10)])
    x[7] = torch.arange(300) / 8.0  # many exact halfway points between e4m3 codes
    cpu = encodings.encode("fp8_e4m3fn_row_bf16", x)
    assert encodings.encode("fp8_e4m3fn_row_bf16", x.cuda()) == cpu
