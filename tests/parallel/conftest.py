"""The launcher's rendezvous environment (`MASTER_ADDR`, ..), undone after a test that ran it."""
import pytest

from ninfer_engine.parallel import leave


@pytest.fixture
def rendezvous_env(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "NINFER_FAULT"):
        monkeypatch.setenv(name, "")  # recorded, so the launcher's values are undone after
        monkeypatch.delenv(name)
    yield
    leave()
