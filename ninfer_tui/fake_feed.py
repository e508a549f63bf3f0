"""A deterministic fake supervisor for the console's tests, screenshots and demos.

Each scenario is a fixed script of `EngineStats` frames on a fixed clock (no randomness, no wall
clock): `snapshot()` returns the next frame per call and then keeps returning the last one, so the
sparkline history a console collects is the same however often it polls. The scenarios are in
`fake_scenarios`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ninfer_engine.cli.flag_table import PROFILES
from ninfer_engine.stats import EngineStats

from .fake_scenarios import FRAME_S, SCENARIOS, T0, WAVE

if TYPE_CHECKING:
    from .app import NinferConsole

LOG = (
    "11:02:03 INFO  ninfer-serve 0.1.0 listening on http://127.0.0.1:8080",
    "11:02:44 INFO  engine ready in 41.2 s (weights 15.0 GiB, KV 3072 pages int8)",
    "11:40:10 INFO  r-0210 cancelled by client after 17 tokens",
    "12:04:31 WARNING  KV pool 91% used; admission waits for pages",
    "12:05:06 INFO  decode 41.8 tok/s · prefill 0 tok/s · batch 1 · KV 12%",
)


class FakeSupervisor:
    """Satisfies `ConsoleSupervisor` and records what the console asked of it."""

    listen_url = "http://127.0.0.1:8080"
    auth_enabled = True
    profiles = PROFILES

    drain_s = 10.0

    def __init__(self, scenario: str, frames: int = 4 * len(WAVE)) -> None:
        build = SCENARIOS[scenario]
        self.frames = with_counters(tuple(replace(build(i % len(WAVE)), at=T0 + i * FRAME_S)
                                          for i in range(frames)))
        self.next_frame = 0
        self.cancelled: list[str] = []
        self.artifact = f"/srv/models/{self.frames[0].model_id}.ninfer"
        self.profile = self.frames[0].profile
        self.paused = self.frames[0].admission == "paused"
        self.reloads: list[str | None] = []
        self.admission_calls: list[str] = []
        self.gpus = len(self.frames[0].devices)
        extra = ("12:05:40 ERROR  engine failed: " + (self.frames[0].failure or ""),)
        self.log = LOG + extra if scenario == "failed" else LOG

    @property
    def at_last_frame(self) -> bool:
        return self.next_frame >= len(self.frames)

    def snapshot(self) -> EngineStats:
        frame = self.frames[min(self.next_frame, len(self.frames) - 1)]
        self.next_frame += 1
        return frame

    def check_profile(self, name: str) -> str | None:
        flags = self.profiles[name]
        tp = int(flags[flags.index("--tp") + 1]) if "--tp" in flags else 1
        if tp > self.gpus:
            return f"--tp {tp} needs {tp} CUDA devices; this machine has {self.gpus}."
        return None

    def reload(self, profile: str | None = None) -> None:
        self.reloads.append(profile)
        if profile is not None:
            self.profile = profile

    def pause_admission(self) -> None:
        self.admission_calls.append("pause")
        self.paused = True

    def resume_admission(self) -> None:
        self.admission_calls.append("resume")
        self.paused = False

    def cancel(self, request_id: str) -> bool:
        self.cancelled.append(request_id)
        return True

    def log_lines(self) -> list[str]:
        return list(self.log)


def with_counters(frames: tuple[EngineStats, ...]) -> tuple[EngineStats, ...]:
    """The frames with monotonic step counters that add up each frame's own throughput (what
    the console's history reads), as an engine's would."""
    out, decode, prefill, steps, rows = [], 0.0, 0.0, 0, 0.0
    for frame in frames:
        tp = frame.throughput
        decode += tp.decode_tok_s * FRAME_S
        prefill += tp.prefill_tok_s * FRAME_S
        steps, rows = steps + 1, rows + tp.batch
        counters = replace(frame.counters, decode_tokens=round(decode),
                           prefill_tokens=round(prefill), steps=steps, batch_rows=round(rows))
        out.append(replace(frame, counters=counters))
    return tuple(out)


def play_all(app: NinferConsole, feed: FakeSupervisor) -> None:
    """Make `app` poll until `feed` has handed out every frame, so its history is complete."""
    while not feed.at_last_frame:
        app.poll_supervisor()
