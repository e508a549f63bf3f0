"""Injected failures for tests of the failure paths (`NINFER_FAULT`, read at engine start)."""
from __future__ import annotations

from typing import Any


class Faults:
    """`NINFER_FAULT=step:N` breaks the step loop at step N; `request:ID` fails that request.
    A `@rankR` suffix (`step:3@rank1`) puts the fault on tensor-parallel rank R only."""

    def __init__(self, spec: str, rank: int = 0) -> None:
        spec, on_rank, target = spec.partition("@rank")
        if on_rank and int(target) != rank:
            spec = ""
        kind, _, value = spec.partition(":")
        self.step = int(value) if kind == "step" else None
        self.request = value if kind == "request" else None

    def check_step(self, step: int) -> None:
        if self.step is not None and step >= self.step:
            raise RuntimeError(f"injected engine fault at step {step}")

    def check_request(self, seq: Any) -> None:
        if self.request is not None and seq.id == self.request:
            raise RuntimeError(f"injected fault in request {seq.id}")
