"""Fixtures for the whole suite: the device under test and one torch thread per test."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    # Before any test module imports a kernel: triton.jit picks the interpreter at decoration,
    # and the engine imports its kernels, so whichever test directory is collected first wins.
    # CPU tensors still take the torch references through the kernels' dispatchers.
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device the engine and model tests run our model on: `NINFER_TEST_DEVICE` (default
    cpu, e.g. `cuda` or `cuda:1`); transformers references stay on the CPU."""
    return torch.device(os.environ.get("NINFER_TEST_DEVICE", "cpu"))


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared 2-core box OpenMP barriers
    waiting for descheduled workers make them tens of times slower. Session-wide, so module
    fixtures that build or convert models run on one thread too."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def restore_log_config():
    """What a test does to the `ninfer` and `aiohttp` loggers (an in-process server or console
    runs `configure_logging`: its own handler on a stream that test owns, propagation off) is
    undone after it, so a later test's caplog still sees their records."""
    import logging

    loggers = [logging.getLogger(name) for name in ("ninfer", "aiohttp")]
    saved = [(lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    yield
    for lg, (handlers, level, propagate) in zip(loggers, saved):
        lg.handlers[:] = handlers
        lg.setLevel(level)
        lg.propagate = propagate
