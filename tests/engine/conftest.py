import pytest

from ninfer_engine import engine_load


@pytest.fixture(autouse=True)
def engine_on_test_device(device, monkeypatch):
    """The Engine serves on CUDA whenever it can: pin it to the device under test."""
    monkeypatch.setattr(engine_load, "serving_device", lambda config: device)
