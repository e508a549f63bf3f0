"""Fixtures for artifact tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .builders import sample_tensors, write_small


@pytest.fixture
def tensors() -> dict[str, torch.Tensor]:
    return sample_tensors()


@pytest.fixture
def small(tmp_path, tensors) -> Path:
    return write_small(tmp_path / "small.ninfer", tensors)
