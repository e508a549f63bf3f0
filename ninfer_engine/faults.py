"""Injected failures for tests of the failure paths (`NINFER_FAULT`, read at engine start)."""
from __future__ import annotations

from typing import Any


class EngineFault(RuntimeError):
    """An injected failure of the engine itself: the step that meets it never ends only its
    own rows (`step.step_failure`)."""


class Faults:
    """`NINFER_FAULT=step:N` fails the engine at step N; `rows:N` fails step N alone (its
    requests end with an error, the engine goes on); `request:ID` fails that request.
    A `@rankR` suffix (`step:3@rank1`) puts the fault on tensor-parallel rank R only."""

    def __init__(self, spec: str, rank: int = 0) -> None:
        spec, on_rank, target = spec.partition("@rank")
        if on_rank and int(target) != rank:
            spec = ""
        kind, _, value = spec.partition(":")
        self.step = int(value) if kind == "step" else None
        self.rows = int(value) if kind == "rows" else None
        self.request = value if kind == "request" else None

    def check_step(self, step: int) -> None:
        if self.step is not None and step >= self.step:
            raise EngineFault(f"injected engine fault at step {step}")
        if step == self.rows:
            self.rows = None  # once: the step counter stays where the failed step left it
            raise RuntimeError(f"injected fault in step {step}")

    def check_request(self, seq: Any) -> None:
        if self.request is not None and seq.id == self.request:
            raise RuntimeError(f"injected fault in request {seq.id}")
