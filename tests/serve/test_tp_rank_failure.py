"""A tensor-parallel rank's failure through the real `ninfer-serve --no-tui` (contract §10 exit
codes): `--tp 2` as two gloo processes on the CPU (`NINFER_TP_CPU=1`, ours: the same launcher
and lockstep as on GPUs) serving a tiny synthetic artifact (the default model's 9 heads do not
split in two), a fault injected on rank 1 at its step N (`NINFER_FAULT=step:N@rank1`): the
running stream ends in-band with 503, `/health` answers 503, and the process exits 2."""
from __future__ import annotations

import time

from server_process import MODEL_ID, chat_body, server_env
from sse_client import stream_through_failure

from ninfer_engine.artifact.synth import write_synthetic

FAULT_STEP = 12  # rank 1's steps: the prompt's, then a few decode steps of the stream
EXIT_BOUND_S = 10.0  # the 250 ms watchdog plus closing the listener, on a busy machine


def test_a_rank_1_fault_fails_the_stream_and_exits_2(launch, tmp_path):
    tiny = write_synthetic("tiny-dense", tmp_path / "tiny.ninfer")
    # --no-thinking: the answer is content, which the stream reader waits for
    env = server_env(NINFER_TP_CPU="1", NINFER_FAULT=f"step:{FAULT_STEP}@rank1")
    server = launch("--tp", "2", "--devices", "0,1", "--model-id", MODEL_ID, "--no-thinking",
                    model=tiny, env=env).wait_ready()

    stream, health, failed_at = stream_through_failure(
        server.url, chat_body("Count to fifty.", 200), EXIT_BOUND_S)
    exit_code = server.wait(timeout=EXIT_BOUND_S)
    log = server.log()
    assert stream.status == 200 and stream.text, "the stream started on both ranks"
    assert stream.finish is None and not stream.done, f"it must not end normally: {stream}"
    assert stream.error["code"] == "service_unavailable"
    assert "503" in health and health[-1] == "down"
    assert exit_code == 2, log
    assert time.monotonic() - failed_at < EXIT_BOUND_S
    assert "tensor-parallel rank 1" in log and "(exit status 2)" in log
