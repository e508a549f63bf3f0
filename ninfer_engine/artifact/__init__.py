"""The `.ninfer` artifact container, its tensor encodings and the converters into it."""

from .container import Artifact, open_artifact
from .errors import ArtifactError
from .writer import ArtifactWriter

__all__ = ["Artifact", "ArtifactError", "ArtifactWriter", "open_artifact"]
