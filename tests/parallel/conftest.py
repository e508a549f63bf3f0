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


def pytest_collection_modifyitems(config, items):
    """The gloo tests here run their ranks on the CPU and compare them with a tp1 engine in the
    test process, which on a CUDA machine would take the GPU (bf16, graphs): there they skip,
    and the `gpu` tests (two GPUs over nccl) cover CUDA."""
    import torch

    if not torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="a gloo-on-CPU test; CUDA machines run the gpu tests here")
    for item in items:
        if "tests/parallel/" in str(item.path) and "gpu" not in item.keywords:
            item.add_marker(skip)
