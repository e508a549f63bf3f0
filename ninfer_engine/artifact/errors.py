"""The single error type of the artifact package (defined with the codecs, which raise it too)."""

from __future__ import annotations

from ..codecs.base import ArtifactError

__all__ = ["ArtifactError"]
