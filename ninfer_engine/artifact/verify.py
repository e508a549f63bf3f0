"""Payload digests: what `metadata.payload_sha256` covers, and checking it.

Every artifact `ArtifactWriter` writes records ``metadata.payload_sha256``: the SHA-256 (64
lowercase hex digits) of the artifact's one logical payload (ninfer-format.md §1.1), i.e. the
payload segments of all its files concatenated in ``files`` order. For a single-file artifact
that is every byte of the file from the payload start ``S = align_up(32 + json_bytes, 4096)``
to the end of the file: objects, the gaps between them and any tail. The header, the JSON
directory (which holds the digest) and the zero padding before ``S`` are not covered; the reader
validates those strictly. With continuation files, each one's bytes from 4096 to its end follow
in order. The writer hashes the bytes as it appends them, so the digest costs no second pass.

Files without the field (upstream files, artifacts written before it existed) remain valid. For
the published upstream files in `PUBLISHED` the SHA-256 of the whole file is known instead.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .errors import ArtifactError

DIGEST_KEY = "payload_sha256"
CHUNK = 1 << 24  # 16 MiB: hashlib releases the GIL while it hashes a chunk
_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Published:
    """An official upstream file whose whole-file SHA-256 is published on its model card."""

    name: str
    version: int  # container framing of the published file
    size: int
    sha256: str


# The model cards' files (neroued/Qwen3.6-27B-NInfer, neroued/Qwen3.6-35B-A3B-NInfer), as the
# format doc (§1.3) lists them. Matched by framing and exact size, whatever the local file name.
PUBLISHED = (
    Published("qwen3_6_27b.ninfer", 1, 17_495_365_888,
              "74fac75f3a6b7ab7b52e08c36969c7a33a8ba23465910eccd72d195adb497127"),
    Published("qwen3_6_35b_a3b.ninfer", 1, 22_783_246_080,
              "5194407dd6d3092b8c2f81ce41e014b50ca0d6f1ba4e5d8c1492b8652bfa267f"),
)


def check_digest_field(value: object) -> None:
    """Raise unless ``value`` is a well-formed ``metadata.payload_sha256``."""
    if not isinstance(value, str) or not _HEX.fullmatch(value):
        raise ArtifactError(f"metadata.{DIGEST_KEY} must be 64 lowercase hex digits")


def recorded_digest(artifact) -> str | None:
    """The artifact's ``metadata.payload_sha256``, or None when it records none."""
    return artifact.metadata.get(DIGEST_KEY)


def payload_sha256(artifact, stop: threading.Event | None = None) -> str | None:
    """SHA-256 of the artifact's logical payload, read from its memory maps in 16 MiB chunks
    (the same files the artifact opened, even if a path was replaced since); None if ``stop``
    was set before the end."""
    digest = hashlib.sha256()
    for view in artifact.payload_chunks(CHUNK):
        if stop is not None and stop.is_set():
            view.release()
            return None
        digest.update(view)
        view.release()
    return digest.hexdigest()


def mismatch(path: object, expected: str, actual: str) -> ArtifactError:
    return ArtifactError(
        f"payload digest does not match: metadata.{DIGEST_KEY} records {expected[:16]}…, the "
        f"payload hashes to {actual[:16]}… (the file is corrupt or was modified after writing)",
        path,
    )


def check_payload(artifact) -> str | None:
    """Verify the recorded payload digest: the digest when it matches, None when the artifact
    records none; a mismatch raises one ArtifactError naming the file."""
    expected = recorded_digest(artifact)
    if expected is None:
        return None
    actual = payload_sha256(artifact)
    if actual != expected:
        raise mismatch(artifact.path, expected, actual)
    return actual


def published_entry(artifact) -> Published | None:
    """The `PUBLISHED` file this artifact could be (same framing, same size), if any."""
    size = os.stat(artifact.path).st_size
    for entry in PUBLISHED:
        if artifact.version == entry.version and size == entry.size and len(artifact.files) == 1:
            return entry
    return None


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a whole file, read in 16 MiB chunks."""
    digest = hashlib.sha256()
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while n := handle.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


class BackgroundCheck:
    """`check_payload` on its own thread, so that the digest is computed while the engine reads
    the weights (hashlib releases the GIL). ``on_mismatch`` runs on that thread as soon as a
    mismatch is known (the engine closes the artifact there, which stops its load early).
    ``result()`` waits and raises the mismatch, if any."""

    def __init__(self, artifact, on_mismatch: Callable[[], None] | None = None) -> None:
        self._artifact = artifact
        self._on_mismatch = on_mismatch
        self._stop = threading.Event()
        self._error: ArtifactError | None = None
        self.seconds: float | None = None
        self._thread = threading.Thread(target=self._run, name="ninfer-verify", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.perf_counter()
        expected = recorded_digest(self._artifact)
        try:
            actual = payload_sha256(self._artifact, self._stop)
        except (ArtifactError, OSError, ValueError) as error:  # the artifact was closed
            self._error = ArtifactError(f"cannot verify the payload: {error}", self._artifact.path)
            return
        self.seconds = time.perf_counter() - started
        if actual is not None and actual != expected:
            self._error = mismatch(self._artifact.path, expected, actual)
            if self._on_mismatch is not None:
                self._on_mismatch()

    def result(self) -> None:
        """Wait for the check; raise its ArtifactError on a mismatch."""
        self._thread.join()
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        """Stop hashing at the next chunk (the caller gave up for another reason)."""
        self._stop.set()
        self._thread.join()
