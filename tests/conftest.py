import os

import pytest
import torch


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the engine and model tests run our model on: `NINFER_TEST_DEVICE` (default
    cpu, e.g. `cuda` or `cuda:1`); transformers references stay on the CPU."""
    return torch.device(os.environ.get("NINFER_TEST_DEVICE", "cpu"))
