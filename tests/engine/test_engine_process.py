"""`EngineProcess`: the engine in a process of its own, on the real default model (CPU).

The child runs the same `Engine`; what can go wrong is the pipe: events lost, reordered or sent
to the wrong stream, a cancel that does not reach the child, a child that dies without its
readers hearing of it, a load error that does not come back as one line. Each is checked here
against the in-process engine or the contract of `ServingEngine.submit`."""
from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ninfer_engine.cli.flags import default_artifact
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine_load import EngineLoadError
from ninfer_engine.engine_process import EngineProcess
from ninfer_engine.types import EngineState, GenerationRequest, SamplingParams

MODEL = default_artifact()
WAIT_S = 30.0  # a cancel or a death seen by the parent, on a busy 2-core machine
EXIT_BOUND_S = 120.0  # a load (~5-40 s on a busy 2-core machine), then the exit hook's 5 s
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(not MODEL.exists(), reason=f"default model not prepared: {MODEL}"),
]

QUESTIONS = ["Name three colours.", "What is 2 + 2? Answer briefly.", "List the days of the week."]


def _config() -> EngineConfig:
    return EngineConfig(artifact=MODEL, max_context=1024, max_concurrency=4)


def spawn(config: EngineConfig | None = None) -> EngineProcess:
    """The child of `config` (the default model's here) on one thread, as this test process
    runs (conftest): the same arithmetic in both, whatever the machine's core count."""
    before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        engine = EngineProcess(config or _config())
    finally:
        if before is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = before
    engine.start()
    return engine


def _prompt(engine, question: str) -> tuple[int, ...]:
    messages = [{"role": "user", "content": question}]
    return tuple(engine.tokenizer.encode(engine.chat_template.render(messages)))


async def _generate(engine, rid: str, prompt, sampling, max_tokens: int):
    events = [e async for e in engine.submit(GenerationRequest(rid, prompt, sampling,
                                                               max_tokens=max_tokens))]
    tokens = tuple(t for e in events for t in e.token_ids)
    return tokens, "".join(e.text for e in events), events[-1]


async def _batch(engine):
    samplings = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0),
                 SamplingParams(temperature=0.8, seed=7)]
    return await asyncio.gather(*[
        _generate(engine, f"r{i}", _prompt(engine, q), s, 24 + 4 * i)
        for i, (q, s) in enumerate(zip(QUESTIONS, samplings))])


@pytest.fixture(scope="module")
def child():
    # as the server logs (`configure_logging`): `ninfer` at info, the root logger at warning;
    # put back after, for the tests that read records through the root (caplog)
    ninfer, text = logging.getLogger("ninfer"), io.StringIO()
    handler, level = logging.StreamHandler(text), ninfer.level
    ninfer.addHandler(handler)
    ninfer.setLevel(logging.INFO)
    try:
        engine = spawn()
        engine.load_log = text.getvalue()
        yield engine
        engine.stop()
    finally:
        ninfer.removeHandler(handler)
        ninfer.setLevel(level)


def test_the_childs_info_lines_reach_the_servers_log(child):
    """The engine's load lines, logged in the child at info, come out of the server's handler
    (the child once took the root logger's level, warning, and dropped them)."""
    assert "CPU decode:" in child.load_log or "payload digest verified" in child.load_log


def test_the_same_tokens_as_the_engine_in_this_process(child):
    from ninfer_engine.engine import Engine

    local = Engine(_config())
    local.start()
    try:
        expected = asyncio.run(_batch(local))
    finally:
        local.stop()
    got = asyncio.run(_batch(child))
    for (tokens, text, last), (want_tokens, want_text, want_last) in zip(got, expected):
        assert tokens == want_tokens and text == want_text
        assert (last.finish, last.usage.completion_tokens) == (want_last.finish,
                                                               want_last.usage.completion_tokens)
    assert child.state is EngineState.READY
    assert child.snapshot().state == "ready"


def test_closing_a_stream_early_cancels_it_in_the_child(child):
    async def scenario():
        prompt = _prompt(child, QUESTIONS[2])
        stream = child.submit(GenerationRequest("early", prompt, SamplingParams(temperature=0.0),
                                                max_tokens=500, ignore_eos=True))
        seen = 0
        async for event in stream:
            seen += len(event.token_ids)
            if seen >= 3:
                break
        await stream.aclose()
        deadline = time.monotonic() + WAIT_S
        while child.snapshot().queue.running and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        after = await _generate(child, "after", prompt, SamplingParams(temperature=0.0), 8)
        return seen, after

    seen, (tokens, _, last) = asyncio.run(scenario())
    assert seen >= 3
    assert not child.snapshot().queue.running, "the cancelled request still runs in the child"
    assert len(tokens) == 8 and last.finish == "length"


def test_host_figures_are_the_servers_both_processes(child):
    """RSS and CPU in the snapshot cover the HTTP process and the engine process: the console
    shows the server's, not the engine half's."""
    deadline = time.monotonic() + WAIT_S
    while child.snapshot().host.process_rss == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    reported = child.snapshot().host.process_rss
    mine = psutil.Process().memory_info().rss
    engine = psutil.Process(child._process.pid).memory_info().rss
    # both processes' RSS moves between the snapshot and now (allocations, page-ins): a
    # quarter of the smaller one is far below either process alone
    slack = min(mine, engine) // 4
    assert abs(reported - (mine + engine)) < slack, (reported, mine, engine)


def test_signals_for_the_server_do_not_stop_the_child(child):
    """Ctrl-C in a terminal and systemd's stop signal the whole process group: the child
    leaves the drain to the parent, which stops it."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(child._process.pid, sig)
    time.sleep(0.5)
    tokens, _, last = asyncio.run(_generate(child, "after-signals", _prompt(child, QUESTIONS[1]),
                                            SamplingParams(temperature=0.0), 6))
    assert child._process.is_alive() and child.state is EngineState.READY
    assert len(tokens) == 6 and last.finish == "length"


def test_a_child_that_dies_fails_its_requests_and_the_engine():
    engine = spawn()
    reasons: list[str] = []
    engine.add_failure_listener(reasons.append)

    async def scenario():
        stream = engine.submit(GenerationRequest(
            "doomed", _prompt(engine, QUESTIONS[0]), SamplingParams(temperature=0.0),
            max_tokens=100_000, ignore_eos=True))
        events = []
        async for event in stream:
            events.append(event)
            if len(events) == 2:
                os.kill(engine._process.pid, signal.SIGKILL)
        return events

    try:
        events = asyncio.run(asyncio.wait_for(scenario(), WAIT_S))
    finally:
        engine.stop()
    last = events[-1]
    assert last.finish == "error" and last.error.status == 503
    assert engine.state is EngineState.FAILED
    assert reasons and "engine process exited" in reasons[0] and str(-signal.SIGKILL) in reasons[0]

    async def refused():
        return [e async for e in engine.submit(GenerationRequest(
            "late", (1, 2, 3), SamplingParams(temperature=0.0), max_tokens=4))]
    late = asyncio.run(refused())
    assert len(late) == 1 and late[0].error.status == 503


EXITING = """
import sys
from ninfer_engine.config import EngineConfig
from ninfer_engine.engine_process import EngineProcess
if __name__ == "__main__":
    engine = EngineProcess(EngineConfig(artifact=sys.argv[1], max_context=256))
    print(engine._process.pid, flush=True)
    sys.exit(3)  # an error after the load: no stop()
"""


def test_a_server_that_exits_without_stop_takes_its_engine_along(tmp_path):
    """The child ignores SIGTERM, which multiprocessing's exit hook sends a daemonic child
    before waiting for it: without the engine's own hook the server would never exit."""
    script = tmp_path / "exiting.py"
    script.write_text(EXITING)
    done = subprocess.run([sys.executable, str(script), str(MODEL)], capture_output=True,
                          text=True, timeout=EXIT_BOUND_S, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 3, done.stderr
    pid = int(done.stdout.split()[0])
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_load_error_comes_back_as_one_line(tmp_path):
    broken = tmp_path / "broken.ninfer"
    broken.write_bytes(b"not an artifact")
    with pytest.raises(EngineLoadError) as raised:
        EngineProcess(EngineConfig(artifact=broken, max_context=256))
    message = str(raised.value)
    assert "\n" not in message and "broken.ninfer" in message


@pytest.mark.parametrize("env, config, expected", [
    ("1", {}, True), ("0", {"engine_process": True}, False), ("", {"engine_process": True}, True),
    ("", {"vision": True}, None),  # media are decoded here and encoded in the engine process
    ("", {}, None),  # the default: CUDA's availability
])
def test_where_the_engine_runs(monkeypatch, env, config, expected):
    import torch

    from ninfer_engine.engine_factory import _in_own_process

    monkeypatch.setenv("NINFER_ENGINE_PROCESS", env)
    chosen = _in_own_process(EngineConfig(artifact=MODEL, **config))
    assert chosen == (torch.cuda.is_available() if expected is None else expected)
