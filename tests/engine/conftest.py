import pytest
import torch

from ninfer_engine import engine


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core box OpenMP barriers
    waiting for descheduled workers make them tens of times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def engine_on_test_device(device, monkeypatch):
    """The Engine serves on CUDA whenever it can: pin it to the device under test."""
    monkeypatch.setattr(engine, "serving_device", lambda config: device)
