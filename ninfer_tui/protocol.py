"""`ConsoleSupervisor`: what the console needs of the engine's supervisor, and nothing more.

`console.ConsoleBridge` adapts the real `Supervisor`; `fake_feed.FakeSupervisor` scripts one for
tests and screenshots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ninfer_engine.stats import EngineStats


class ConsoleSupervisor(Protocol):
    """What the console needs of the engine supervisor; everything else stays behind it."""

    @property
    def listen_url(self) -> str: ...
    @property
    def auth_enabled(self) -> bool: ...
    @property
    def artifact(self) -> str: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def profiles(self) -> Mapping[str, Sequence[str]]:
        """Profile name -> the flags it inserts (the `--profile` table)."""

    @property
    def paused(self) -> bool:
        """True while admission of new requests is paused."""

    @property
    def drain_s(self) -> float:
        """How long a quit lets running requests finish (`--drain-timeout-ms`)."""

    def snapshot(self) -> EngineStats:
        """The latest published snapshot; cheap, called from the UI thread."""

    def check_profile(self, name: str) -> str | None:
        """None when profile `name` can run on this machine, else the reason it cannot."""

    def reload(self, profile: str | None = None) -> None:
        """Reload the engine (with `profile`, or the current flags); blocks until it is done."""

    def pause_admission(self) -> None: ...
    def resume_admission(self) -> None: ...

    def cancel(self, request_id: str) -> bool:
        """End one waiting or running request (503 to its client); False if it is gone."""

    def log_lines(self) -> list[str]:
        """The most recent stderr log lines, oldest first."""
