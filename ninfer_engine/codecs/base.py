"""What the storage codecs share: the error of stored bytes that break their format (an
artifact's file, a tensor's encoding; `artifact.ArtifactError` is this class) and alignment."""

from __future__ import annotations


class ArtifactError(Exception):
    """A `.ninfer` file (or a conversion source) violates its contract.

    ``str(error)`` is one line: ``"<file>: <problem>"`` when the file is known.
    """

    def __init__(self, problem: str, path: object = None) -> None:
        super().__init__(problem)
        self.problem = " ".join(str(problem).split())
        self.path = None if path is None else str(path)

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}" if self.path else self.problem

    def at(self, path: object) -> ArtifactError:
        """The same problem attributed to ``path`` (kept if one is already named)."""
        return self if self.path else ArtifactError(self.problem, path)


def align_up(value: int, alignment: int) -> int:
    """The smallest multiple of ``alignment`` that is >= ``value``."""
    return -(-value // alignment) * alignment
