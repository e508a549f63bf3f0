"""`helpers.fresh_process` runs the test it decorates in a pytest process of its own, decorated
as the CUDA warm-up checks are (under `torch.inference_mode()`, whose wrapper has torch's file:
the child was asked for a test in torch's `_contextlib.py`, ran none and failed on the H200)."""
import os

import torch

from tests.engine.helpers import FRESH_PROCESS, fresh_process


@fresh_process
@torch.inference_mode()
def test_a_decorated_test_runs_in_a_process_of_its_own():
    assert os.environ.get(FRESH_PROCESS) == "1"  # the child's: the parent only starts it
    assert torch.is_inference_mode_enabled()
