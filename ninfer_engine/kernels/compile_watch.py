"""Triton compiles after start-up, named in the log.

A kernel variant the start-up warm-up did not run (a new constexpr, or an integer argument that
Triton specialises on `== 1` / `% 16 == 0`) compiles on the step that first needs it, and every
row of that step waits for it. `watch()` (the engine calls it once its warm-up is done) logs each
such compile with its kernel, signature and milliseconds, so a served benchmark's log says
whether a stall was a compile.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import traceback

log = logging.getLogger("ninfer.engine")

_lock = threading.Lock()
_started: dict[int, float] = {}  # thread id -> perf_counter at the compile's start
_installed = False


def watch() -> bool:
    """Install the hooks (once a process; hooks set before are still called). False where
    Triton (or its runtime hooks, Triton >= 3.3) is missing."""
    global _installed
    try:
        from triton import knobs
    except ImportError:
        return False
    if not hasattr(knobs.runtime, "jit_post_compile_hook"):
        return False
    with _lock:
        if _installed:
            return True
        before_start = knobs.runtime.jit_cache_hook
        before_end = knobs.runtime.jit_post_compile_hook

        def start(**kw):
            _started[threading.get_ident()] = time.perf_counter()
            return before_start(**kw) if before_start else False

        def end(**kw):
            _record(kw)
            if before_end:
                before_end(**kw)

        knobs.runtime.jit_cache_hook = start
        knobs.runtime.jit_post_compile_hook = end
        _installed = True
    return True


def _record(hook_kwargs: dict) -> None:
    """Log the compile that Triton's post-compile hook arguments describe."""
    began = _started.pop(threading.get_ident(), None)
    ms = (time.perf_counter() - began) * 1e3 if began is not None else float("nan")
    fn = hook_kwargs.get("fn")
    log.warning("Triton compiled %s while serving (%.0f ms; the start-up warm-up did not run "
                "this variant), called from %s: %s", getattr(fn, "name", fn), ms, call_site(),
                variant(hook_kwargs))


def variant(hook_kwargs: dict) -> str:
    """What tells a compile's variant apart, from Triton's hook arguments: its constexprs (and
    integers specialised to 1), and which of the specialisable arguments (pointers, integers)
    are not divisible by 16 (the others carry `tt.divisibility` 16)."""
    compiled = hook_kwargs.get("compile") or {}
    configs = compiled.get("configs") or [{}]
    plain = sorted(i[0] for i, attrs in configs[0].items()
                   if not any(a[0] == "tt.divisibility" for a in attrs))
    # the arguments' types: a variant of another dtype (an fp32 row, int32 lengths) is new too
    types = [t for t in (compiled.get("signature") or {}).values() if t != "constexpr"]
    return (f"constants {compiled.get('constants')}; arguments not 16-divisible {plain}; "
            f"types {types}")


_KERNELS = os.path.dirname(os.path.abspath(__file__))
_ENGINE = os.path.dirname(_KERNELS)


def call_site(depth: int = 4) -> str:
    """The innermost `depth` engine frames outside the kernels, innermost first: what asked for
    this variant; and, where the model's frames fill them, the innermost step frame (which
    kind of step it was: the runner's eager rows, a graph's capture, the sampler)."""
    sites = [f"{os.path.relpath(path, _ENGINE)}:{frame.lineno}"
             for frame in reversed(traceback.extract_stack())
             if (path := os.path.abspath(frame.filename)).startswith(_ENGINE + os.sep)
             and not path.startswith(_KERNELS + os.sep)]
    shown = " < ".join(sites[:depth]) or "outside the engine"
    step = next((s for s in sites[depth:] if s.startswith("step" + os.sep)), None)
    return shown if step is None else f"{shown} < ... < {step}"
