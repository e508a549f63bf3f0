"""`kernels.compile_watch`: a Triton compile after start-up is named in the log, and hooks set
before it are still called."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from ninfer_engine.kernels import compile_watch


def test_a_compile_after_start_up_is_logged(monkeypatch, caplog):
    knobs = pytest.importorskip("triton").knobs
    if not hasattr(knobs.runtime, "jit_post_compile_hook"):
        pytest.skip("this Triton has no runtime hooks")
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", lambda **kw: seen.append("start"))
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **kw: seen.append("end"))
    monkeypatch.setattr(compile_watch, "_installed", False)
    assert compile_watch.watch() and compile_watch.watch()  # a second call installs nothing
    kw = {"fn": SimpleNamespace(name="_gdn_chunk_kernel"), "repr": "_gdn_chunk_kernel(n: i32)",
          "key": None, "is_manual_warmup": False, "already_compiled": False,
          "compile": {"constants": {(3,): 1},
                      "signature": {"x_ptr": "*bf16", "n": "i32", "BLOCK": "constexpr"},
                      "configs": [{(4,): [["tt.divisibility", 16]], (5,): []}]}}
    with caplog.at_level(logging.WARNING, logger="ninfer.engine"):
        assert not knobs.runtime.jit_cache_hook(**kw)  # Triton goes on to compile
        knobs.runtime.jit_post_compile_hook(**kw)
    assert seen == ["start", "end"]
    assert "Triton compiled _gdn_chunk_kernel while serving" in caplog.text
    assert ("constants {(3,): 1}; arguments not 16-divisible [5]; types ['*bf16', 'i32']"
            in caplog.text)
    assert "called from outside the engine" in caplog.text


def test_the_log_names_the_engine_frames_that_asked_for_the_variant():
    from ninfer_engine.step import sampling_penalties

    def engine_frame():  # stands for an engine module calling a kernel
        return compile_watch.call_site()
    engine_frame.__code__ = engine_frame.__code__.replace(
        co_filename=sampling_penalties.__file__)
    site = engine_frame()
    assert site.startswith("step/sampling_penalties.py:"), site
    assert compile_watch.call_site() == "outside the engine"  # a test is no engine frame


def test_past_the_model_frames_the_log_names_the_step_that_asked():
    """Where the model's frames fill the depth, the innermost step frame follows them."""
    from ninfer_engine.models import gdn
    from ninfer_engine.step import runner

    def model_frame():  # stands for a model module calling a kernel
        return compile_watch.call_site(depth=1)
    model_frame.__code__ = model_frame.__code__.replace(co_filename=gdn.__file__)

    def gdn_frame():  # a second model frame, past the depth
        return model_frame()
    gdn_frame.__code__ = gdn_frame.__code__.replace(co_filename=gdn.__file__)

    def step_frame():  # the runner asking for the model's rows
        return gdn_frame()
    step_frame.__code__ = step_frame.__code__.replace(co_filename=runner.__file__)
    site = step_frame()
    assert site.startswith("models/gdn.py:") and " < ... < step/runner.py:" in site, site
    assert compile_watch.call_site(depth=1) == "outside the engine"
